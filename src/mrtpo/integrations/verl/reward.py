"""verl's reward function :func:`compute_score` and the examples and tasks it reads from
``extra_info`` (written by :mod:`mrtpo.integrations.verl.data`)."""

from __future__ import annotations

import asyncio
import functools
import json
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from mrtpo.integrations.verl.config import _plain
from mrtpo.tasks import faults
from mrtpo.tasks.base import Example, Task
from mrtpo.tasks.conditions import apply_conditions, task_conditions

EXAMPLE_KEY = "mrtpo_example"
"""``extra_info[EXAMPLE_KEY]``: the example (``Example.to_dict()``) as JSON text or a dict."""

TASK_KEY = "mrtpo_task"
"""``extra_info[TASK_KEY]``: the task name (``mrtpo.tasks.load_task``)."""

TASK_KWARGS_KEY = "mrtpo_task_kwargs"
"""``extra_info[TASK_KWARGS_KEY]``: JSON object of the task's constructor arguments (optional)."""

RESERVED_KEYS = frozenset({"score", "acc"})
"""Reward-info keys verl itself uses; a reward may not be named after one."""

ERRORS_KEY = "mrtpo_verifier_errors"
"""The reward-info key of the failed verdicts of a response: a JSON list of ``[reward, cause]`` (empty
text when none; :mod:`mrtpo.tasks.faults`); verl copies it into ``non_tensor_batch``."""


@functools.lru_cache(maxsize=32)
def _load_task(name: str, kwargs_json: str) -> Task:
    from mrtpo.tasks import load_task

    return refuse_policy_judges(load_task(name, **json.loads(kwargs_json)))


def refuse_policy_judges(task: Task) -> Task:
    """``task``, unless one of its model rewards is a judge that is the policy itself (``model: policy``):
    on verl the reward function runs in the reward loop, which holds no policy weights (they live, sharded,
    in the actor workers), so such a judge cannot score there; ValueError naming the reward and the way out.
    """
    for r in getattr(task, "model_rewards", ()):
        if getattr(r, "uses_policy", False):
            raise ValueError(
                f"model reward {r.name!r}: model='policy' is not supported on verl: verl scores rewards in its "
                "reward loop, which holds no policy weights (they are sharded in the actor workers); give the "
                "judge its own model (a folder or hub id, e.g. the policy's starting checkpoint), or train with "
                "mrtpo train (TRL), where the judge is the live policy"
            )
    return task


def task_from_extra_info(extra_info: Mapping[str, Any] | None) -> Task:
    """The task named by ``extra_info["mrtpo_task"]`` (built once per process and name + kwargs)."""
    if not isinstance(extra_info, Mapping) or not extra_info.get(TASK_KEY):
        raise ValueError(
            f"extra_info has no '{TASK_KEY}' (the task name); build the data with "
            "mrtpo.integrations.verl.data (python -m mrtpo.integrations.verl.data --task NAME --out DIR)"
        )
    kwargs = extra_info.get(TASK_KWARGS_KEY) or "{}"
    if isinstance(kwargs, Mapping):
        kwargs = json.dumps(_plain(kwargs), sort_keys=True)
    return _load_task(str(extra_info[TASK_KEY]), str(kwargs))


def example_from_extra_info(extra_info: Mapping[str, Any] | None) -> Example:
    """The :class:`Example` stored in ``extra_info["mrtpo_example"]`` (JSON text or a dict)."""
    if not isinstance(extra_info, Mapping) or extra_info.get(EXAMPLE_KEY) is None:
        raise ValueError(
            f"extra_info has no '{EXAMPLE_KEY}' (the example's segments and meta); build the data with "
            "mrtpo.integrations.verl.data"
        )
    value = extra_info[EXAMPLE_KEY]
    if isinstance(value, (str, bytes)):
        value = json.loads(value)
    return Example.from_dict(_plain(value))


def _extra_infos(non_tensor_batch: Mapping[str, Any] | None, what: str) -> list[Mapping[str, Any]]:
    if non_tensor_batch is None or "extra_info" not in non_tensor_batch:
        raise ValueError(
            f"{what} needs non_tensor_batch['extra_info'] (one dict per response, from the dataset)"
        )
    return list(non_tensor_batch["extra_info"])


def compute_score(
    data_source: str | None = None,
    solution_str: str = "",
    ground_truth: Any = None,
    extra_info: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> dict[str, float]:
    """verl reward function: the task's verifiers on one response, total plus every reward.

    ``{"score": Σ_k r_k, name_1: r_1, ..., name_K: r_K, "mrtpo_verifier_errors": ...}`` with the names in
    ``task.reward_names`` order. A failed verdict (None, NaN, ±inf, out of bounds, an exception, past the
    verifier's ``timeout``: :mod:`mrtpo.tasks.faults`) never raises here: it scores the reward's minimum
    and is listed under :data:`ERRORS_KEY`; the ``compute_advantage`` hook applies the run's policy
    (``algorithm.mrtpo.on_verifier_error``) to the batch.
    verl's reward managers use ``score`` as the response reward and keep every key in
    ``reward_extra_info`` (``non_tensor_batch[name]`` in the trainer), where the ``mrtpo_*``
    estimators read the K columns. ``data_source`` and ``ground_truth`` are not used: the example and
    the task come from ``extra_info`` (see :mod:`mrtpo.integrations.verl.data`).

    Config: ``reward.custom_reward_function.path=pkg://mrtpo.integrations.verl.adapter``,
    ``reward.custom_reward_function.name=compute_score``.

    Raises:
        ValueError: ``extra_info`` without the example or task; a verifier list that does not match the
            task's reward names; a reward named ``score``, ``acc`` or ``mrtpo_verifier_errors``.
    """
    task = task_from_extra_info(extra_info)
    ex = example_from_extra_info(extra_info)
    verifiers = _checked_verifiers(task, ex)
    text = solution_str if isinstance(solution_str, str) else str(solution_str)
    out: dict[str, float] = {}
    failed: list[list[str]] = []
    for v in verifiers:  # a failed verdict holds the reward's minimum; the hook applies the policy
        value, cause = faults.safe_verdict(v, ex, text)
        if cause is not None:
            value = float(v.bounds[0])
            failed.append([v.name, cause])
        out[v.name] = value
    return _result(task, out, failed)


def _checked_verifiers(task: Task, ex: Example) -> list[Any]:
    verifiers = task.verifiers(ex)
    names = [v.name for v in verifiers]
    if names != list(task.reward_names):
        raise ValueError(
            f"task.verifiers(example {ex.id!r}) returns {names}; expected the reward columns {list(task.reward_names)}"
        )
    clash = sorted((RESERVED_KEYS | {ERRORS_KEY}) & set(names))
    if clash:
        raise ValueError(
            f"reward name(s) {clash} collide with the reward-info keys {sorted(RESERVED_KEYS | {ERRORS_KEY})}"
        )
    return verifiers


def _result(task: Task, out: dict[str, float], failed: list[list[str]]) -> dict[str, float]:
    """compute_score's answer from one response's verdicts ``out`` (by reward name, in column order) and
    its failed verdicts ``[[reward, cause], ...]``."""
    names = list(task.reward_names)
    errors = {ERRORS_KEY: json.dumps(failed) if failed else ""}
    conditions = task_conditions(task)
    if conditions:  # GDPO Eq. 8 before the advantages; the raw values stay as "<name>_raw"
        raw = torch.tensor([[out[n] for n in names]], dtype=torch.float64)
        cond = apply_conditions(raw, conditions)[0].tolist()
        raws = {f"{c.reward}_raw": out[c.reward] for c in conditions}
        out = {**dict(zip(names, cond)), **raws}
        return {"score": float(sum(out[n] for n in names)), **out, **errors}
    return {"score": float(sum(out.values())), **out, **errors}


def compute_score_batch(
    data_sources: Sequence[Any] | None = None,
    solution_strs: Sequence[str] = (),
    ground_truths: Sequence[Any] | None = None,
    extra_infos: Sequence[Mapping[str, Any] | None] = (),
    **kwargs: Any,
) -> list[dict[str, float]]:
    """:func:`compute_score` of many responses at once: the same answers (rewards as float32, as the TRL
    trainer scores them), the rows of one task scored together, reward column by reward column
    (:func:`mrtpo.tasks.faults.score_batch`): a model reward then runs ``batch_size`` responses per
    forward on its ``device`` instead of one. The signature of the reward function of verl's legacy
    ``BatchRewardManager``; :func:`compute_score_async` batches verl's reward loop with it."""
    infos = list(extra_infos)
    texts = [t if isinstance(t, str) else str(t) for t in solution_strs]
    if len(texts) != len(infos):
        raise ValueError(f"compute_score_batch: {len(texts)} solution_strs but {len(infos)} extra_infos")
    groups: dict[int, tuple[Task, list[int]]] = {}
    for j, info in enumerate(infos):  # the rows of each task (a mixed dataset holds several)
        task = task_from_extra_info(info)
        groups.setdefault(id(task), (task, []))[1].append(j)
    results: list[dict[str, float]] = [{} for _ in infos]
    for task, rows in groups.values():
        exs = [example_from_extra_info(infos[j]) for j in rows]
        verifiers = [_checked_verifiers(task, ex) for ex in exs]
        names = list(task.reward_names)
        values, found = faults.score_batch(verifiers, exs, [texts[j] for j in rows], names)
        failed: list[list[list[str]]] = [[] for _ in rows]
        for f in found:  # ordered by row, then column: as compute_score lists them
            failed[f.row].append([f.reward, f.cause])
        for i, j in enumerate(rows):
            results[j] = _result(task, dict(zip(names, values[i].tolist())), failed[i])
    return results


class _Batcher:
    """Gathers the concurrent :func:`compute_score_async` calls of one event loop into
    :func:`compute_score_batch` calls: a call waits until no other has arrived for ``LINGER`` seconds, then
    the calls waiting are scored together in a thread (one batch at a time, so a scorer is never run by
    two threads at once)."""

    LINGER = 0.005

    def __init__(self) -> None:
        self.pending: list[tuple[Any, str, asyncio.Future]] = []
        self.gathering = False
        self.lock = asyncio.Lock()
        self.flushes: set[asyncio.Task] = set()  # held until done (the loop keeps only weak references)

    async def submit(self, extra_info: Any, text: str) -> dict[str, float]:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.pending.append((extra_info, text, future))
        if not self.gathering:
            self.gathering = True
            task = loop.create_task(self._flush())
            self.flushes.add(task)
            task.add_done_callback(self.flushes.discard)
        return await future

    async def _flush(self) -> None:
        seen = -1
        while seen != len(self.pending):  # until a linger passes without a new call
            seen = len(self.pending)
            await asyncio.sleep(self.LINGER)
        rows, self.pending, self.gathering = self.pending, [], False
        infos, texts = [r[0] for r in rows], [r[1] for r in rows]
        async with self.lock:
            try:
                out = await asyncio.get_running_loop().run_in_executor(
                    None, lambda: compute_score_batch(None, texts, None, infos)
                )
            except Exception as e:  # a batch that cannot be scored (extra_info without the example, ...)
                for *_, future in rows:
                    future.set_exception(e)
                return
        for (*_, future), result in zip(rows, out, strict=True):
            future.set_result(result)


_BATCHERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Batcher] = weakref.WeakKeyDictionary()


async def compute_score_async(
    data_source: str | None = None,
    solution_str: str = "",
    ground_truth: Any = None,
    extra_info: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> dict[str, float]:
    """:func:`compute_score` as a coroutine, for verl's reward loop, which awaits a coroutine reward function
    and scores the rows of its chunk concurrently (``RewardLoopWorker.compute_score_batch``): the calls of
    one event loop are scored together by :func:`compute_score_batch`, so a model reward scores
    ``batch_size`` responses per forward. Config: ``reward.custom_reward_function.name=compute_score_async``."""
    loop = asyncio.get_running_loop()
    batcher = _BATCHERS.get(loop)
    if batcher is None:
        batcher = _BATCHERS[loop] = _Batcher()
    return await batcher.submit(extra_info, solution_str)


def batch_faults(non_tensor_batch: Mapping[str, Any], names: Sequence[str]) -> list[faults.Fault]:
    """The failed verdicts of a scored batch (``non_tensor_batch[ERRORS_KEY]``, one JSON list per
    response, written by :func:`compute_score`), by row and then column; none when the key is absent."""
    column = non_tensor_batch.get(ERRORS_KEY) if non_tensor_batch is not None else None
    if column is None:
        return []
    infos = non_tensor_batch.get("extra_info")
    out: list[faults.Fault] = []
    for row, text in enumerate(column):
        if not text:
            continue
        try:
            example = example_from_extra_info(infos[row]).id if infos is not None else f"row {row}"
        except (ValueError, TypeError, KeyError):
            example = f"row {row}"
        for name, cause in json.loads(text):
            col = list(names).index(name) if name in names else -1
            out.append(faults.Fault(name, col, row, str(example), cause))
    return out


VERIFIER_ERRORS_META = "mrtpo/verifier_errors"
"""``data.meta_info[VERIFIER_ERRORS_META]``: under ``on_verifier_error=min``, the batch's
``{"verifier_errors/<reward>": count, ..., "verifier_error_rate": share}`` (logged with verl's step
metrics by :class:`mrtpo.integrations.verl.main.MRTPORayPPOTrainer`)."""


def apply_verifier_policy(
    data: Any, policy: faults.VerifierPolicy, names: Sequence[str] | None = None
) -> None:
    """The run's policy for the failed verdicts of a scored batch (:func:`batch_faults`): raises
    :class:`mrtpo.tasks.faults.VerifierError` (``raise``, or more than the allowed share under ``min``),
    else, under ``min``, puts the counts into ``data.meta_info[VERIFIER_ERRORS_META]``. ``names``: the K
    reward columns (None: the task's, from the first ``extra_info``). No-op for a batch that
    :func:`compute_score` did not score."""
    ntb = getattr(data, "non_tensor_batch", None)
    if not isinstance(ntb, Mapping) or ERRORS_KEY not in ntb:
        return
    if names is None:
        names = list(
            task_from_extra_info(_extra_infos(ntb, "the policy for failed verdicts")[0]).reward_names
        )
    found = batch_faults(ntb, names)
    n = len(ntb[ERRORS_KEY])
    faults.apply_policy(found, n * len(names), policy)
    if policy.on_error == "min":
        counts = faults.error_counts([f for f in found if f.col >= 0], len(names))
        meta = {f"verifier_errors/{name}": float(c) for name, c in zip(names, counts)}
        meta["verifier_error_rate"] = len(found) / (n * len(names))
        data.meta_info[VERIFIER_ERRORS_META] = meta
