"""The run folder of a verl run (docs/run-format.md): ``run.json``, ``samples.jsonl`` and ``metrics.jsonl``,
written by the driver from each credit step, so that ``mrtpo explain`` and ``mrtpo report`` read a verl run
as they read a TRL one.

What a step reports comes from the core (:class:`mrtpo.step_log.StepLog`: the metrics, the saved samples
with their rows named by the replay kind and weight rows marked); this module only turns verl's
``DataProto`` into the core's :class:`~mrtpo.step_log.LocalResponse` rows and writes. The driver holds the
whole batch (verl gathers it before ``compute_advantage``), so nothing is reduced across processes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mrtpo import io
from mrtpo.integrations.verl.credit import reward_matrix
from mrtpo.integrations.verl.replay import _response_ids
from mrtpo.integrations.verl.reward import _extra_infos, example_from_extra_info, task_from_extra_info
from mrtpo.step_log import LocalResponse, StepLog, metric_values

RUN_JSON = "run.json"
METRICS_JSONL = "metrics.jsonl"
SAMPLES_JSONL = "samples.jsonl"


def step_metrics(data: Any, result: Any) -> dict[str, float]:
    """The metrics of a credit step on verl's batch without a run folder (no tokenizer: no localization, no
    samples): :meth:`mrtpo.step_log.StepLog.parts` of the whole batch as values."""
    batch = data.batch
    log = StepLog(result, batch["response_mask"].cpu(), token_ids=batch["responses"].cpu())
    return metric_values(log.parts())


def local_responses(data: Any, result: Any, tokenizer: Any) -> list[LocalResponse]:
    """The responses of a verl batch as the core's rows: example and verifiers from ``extra_info``, token ids
    (``responses`` up to each valid length), text decoded as verl's reward loop decodes it (special tokens
    skipped), rewards from the reward columns of the step (``result.reward_names``)."""
    infos = _extra_infos(data.non_tensor_batch, "the run folder's samples")
    ids, _ = _response_ids(data.batch)
    rewards = reward_matrix(data.non_tensor_batch, result.reward_names).tolist()  # [N, K]
    out = []
    for info, r_ids, r in zip(infos, ids, rewards):
        example = example_from_extra_info(info)
        text = tokenizer.decode(r_ids, skip_special_tokens=True)
        out.append(LocalResponse(example, text, r_ids, task_from_extra_info(info).verifiers(example), r))
    return out


@dataclass
class RunFolder:
    """The driver's writer of a verl run's folder.

    Attributes:
        path: the folder (``mrtpo.integrations.verl.main`` uses ``trainer.default_local_dir``, beside verl's
            checkpoints).
        tokenizer: the policy's tokenizer (token strings, checked-token ranges).
        info: what ``run.json`` records besides the rewards (the method block, its label, the model, the
            seed, ``"engine": "verl"``).
        log_samples: responses saved to ``samples.jsonl`` per step (``algorithm.mrtpo.log_samples``).
        localization: log ``localization/<reward>/*`` (reads each response's checked tokens).
    """

    path: Path
    tokenizer: Any
    info: Mapping[str, Any]
    log_samples: int = 2
    localization: bool = True

    def log(
        self, data: Any, result: Any, step: int, bounds: list[list[float]] | None = None
    ) -> dict[str, float]:
        """The step's metrics (:meth:`mrtpo.step_log.StepLog.parts` of the whole batch) and its files:
        ``run.json`` at the first step (the reward names and bounds are known then), a ``metrics.jsonl`` line
        with ``step`` (1-based, verl's ``global_steps``) and the first :attr:`log_samples` responses in
        ``samples.jsonl``. ``bounds``: the rewards' ``[min, max]`` (``run.json``'s ``reward_bounds``)."""
        path = Path(self.path)
        if not (path / RUN_JSON).exists():
            self._write_run_json(result, bounds)
        mask = data.batch["response_mask"].cpu()
        log = StepLog(result, mask, local_responses(data, result, self.tokenizer), self.tokenizer,
                      localization=self.localization)  # fmt: skip
        values = metric_values(log.parts())
        rewards = reward_matrix(data.non_tensor_batch, result.reward_names)  # [N, K]
        means = {f"rewards/{n}/mean": float(rewards[:, k].mean()) for k, n in enumerate(result.reward_names)}
        row = {"step": step, "reward": float(rewards.sum(1).mean()), **means, **values}
        io.append_jsonl(path / METRICS_JSONL, [row])
        if self.log_samples > 0:
            method = (self.info.get("method") or {}).get("method")
            records = log.records(step, self.log_samples, method=method)
            io.append_jsonl(path / SAMPLES_JSONL, [r.to_json() for r in records])
        return values

    def _write_run_json(self, result: Any, bounds: list[list[float]] | None) -> None:
        info = {**self.info, "reward_names": list(result.reward_names)}
        if bounds is not None:
            info["reward_bounds"] = bounds
        path = Path(self.path)
        path.mkdir(parents=True, exist_ok=True)
        (path / RUN_JSON).write_text(json.dumps(info, indent=2, default=str) + "\n", encoding="utf-8")
