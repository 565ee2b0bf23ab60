"""Reading training run folders (docs/run-format.md) and grouping runs into methods and seeds.

A run folder holds ``run.json`` (the resolved config), ``metrics.jsonl`` (one object per logged step)
and ``samples.jsonl`` (a few saved responses with their per-token credit). Runs are grouped into
methods by ``run.json``'s method block (``method``: its ``method`` + ``credit`` + ``credit_beta``;
run folders of earlier versions hold them flat, as ``advantage_method``, ``credit`` and ``credit_beta``
or ``beta``: :func:`run_method` reads both), and the runs of one method are its seeds (``seed``). An
optional ``label`` in ``run.json`` overrides the method's display name; the advantage method's own
display name is the registry's (``run.json``'s ``method_label``, recorded by the trainer; for a run folder
without it, :func:`advantage_label` asks :mod:`mrtpo.advantages`).

Standard library only (the advantage registry is imported only for run folders that lack ``method_label``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mrtpo.io import read_jsonl  # re-exported: the demo reads run files through this module

__all__ = [
    "RESPONSE_LEVEL_CREDITS",
    "Run",
    "advantage_label",
    "find_run_dirs",
    "group_by_method",
    "load_run",
    "method_key",
    "method_label",
    "read_jsonl",
    "run_method",
]


def advantage_label(name: str, config: dict[str, Any] | None = None) -> str:
    """The display name of advantage method ``name``: ``config["method_label"]`` when the run recorded it,
    else the registry's (:attr:`mrtpo.advantages.AdvantageMethod.label`; a method no longer registered:
    ``name.upper()``)."""
    if config and config.get("method_label") and run_method(config).get("method") == name:
        return str(config["method_label"])
    from mrtpo import advantages

    return advantages.ADVANTAGES.get(name).label if name in advantages.ADVANTAGES else name.upper()


RESPONSE_LEVEL_CREDITS = (None, "none", "uniform", "response")
"""``credit`` values meaning "every token gets the response-level advantage" (no replay)."""

DEFAULT_BETA = 0.5


def run_method(config: dict[str, Any]) -> dict[str, Any]:
    """The method block of a run.json (``{"method", "credit", "credit_beta", ...}``): its ``method``
    mapping, or the flat keys of run folders of earlier versions (``advantage_method``, ``credit``,
    ``credit_beta`` or ``beta``)."""
    block = config.get("method")
    if isinstance(block, dict):
        return {"credit_beta": DEFAULT_BETA, **block}
    return {
        "method": config.get("advantage_method"),
        "credit": config.get("credit"),
        "credit_beta": config.get("credit_beta", config.get("beta", DEFAULT_BETA)),
    }


def method_key(config: dict[str, Any]) -> tuple[str, str, float | None]:
    """``(method, credit, credit_beta)`` identifying a method (:func:`run_method`); the allocation strength
    is None for response-level credit."""
    block = run_method(config)
    adv = str(block.get("method") or "?")
    credit = block.get("credit")
    if config.get("loss") == "opsd":
        return adv, "opsd", None
    if credit in RESPONSE_LEVEL_CREDITS:
        return adv, "uniform", None
    beta = block.get("credit_beta")
    return adv, str(credit), None if beta is None else float(beta)


def method_label(config: dict[str, Any]) -> str:
    """Display name of a run's method.

    ``label`` from run.json when set; otherwise ``OPSD`` for the distillation loss (``loss: opsd``), the
    response-level name (``GDPO``) for response-level credit (``uniform``/``none``), ``MRTPO`` for reward
    credit on GDPO, ``MRTPO+SAW`` on another method, ``MRTPO (joint)`` / ``MRTPO (shuffled)`` for the
    ablations, ``MRTPO (scaled)`` / ``MRTPO (scaled, shuffled)`` for the scaled allocation and its control, ``CoRT`` (``CoRT+GDPO`` on a method other than GRPO), ``RLSD`` (``RLSD+RDPO`` on a method other than GDPO), and `` β=0.25`` appended when β is
    not 0.5.
    """
    if config.get("label"):
        return str(config["label"])
    adv, credit, beta = method_key(config)
    name = advantage_label(adv, config)
    if credit == "opsd":
        return "OPSD"
    if credit == "uniform":
        return name
    base = "MRTPO" if adv == "gdpo" else f"MRTPO+{name}"
    if credit == "reward":
        label = base
    elif credit in ("joint", "shuffled", "scaled"):
        label = f"{base} ({credit})"
    elif credit == "scaled_shuffled":
        label = f"{base} (scaled, shuffled)"
    elif credit == "cort":
        label = "CoRT" if adv == "grpo" else f"CoRT+{name}"
    elif credit == "rlsd":
        label = "RLSD" if adv == "gdpo" else f"RLSD+{name}"
    else:
        label = f"{name}+{credit}"
    if beta is not None and beta != DEFAULT_BETA:
        label += f" β={beta:g}"
    return label


@dataclass
class Run:
    """One training run folder.

    Attributes:
        path: the folder.
        config: run.json.
        metrics: the rows of metrics.jsonl in file order: one per logged training step.
        summary: the rows of summary.jsonl, one per training session (a run, each resume): its closing
            summary (``train_runtime``, ``train_loss``, ...; ``resumed_from``).
        evals: the rows of eval.jsonl, one per evaluation (``eval_*`` keys).

    Run folders of earlier versions wrote the summary and the evaluations into metrics.jsonl, repeating
    a step number: :func:`load_run` moves those rows here.
    """

    path: Path
    config: dict[str, Any]
    metrics: list[dict[str, Any]] = field(default_factory=list)
    summary: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)

    @property
    def train_seconds(self) -> float | None:
        """The training time of the run, summed over its sessions (None when none ended)."""
        times = [r["train_runtime"] for r in self.summary if isinstance(r.get("train_runtime"), (int, float))]
        return float(sum(times)) if times else None

    @property
    def seed(self) -> Any:
        return self.config.get("seed")

    @property
    def label(self) -> str:
        return method_label(self.config)

    @property
    def reward_names(self) -> list[str]:
        return [str(n) for n in self.config.get("reward_names") or []]

    @property
    def reward_bounds(self) -> list[tuple[float, float]] | None:
        b = self.config.get("reward_bounds")
        if not b:
            return None
        return [(float(lo), float(hi)) for lo, hi in b]

    @property
    def samples_path(self) -> Path:
        return self.path / "samples.jsonl"

    def samples(self) -> Iterator[dict[str, Any]]:
        """The records of samples.jsonl (none when the file is absent)."""
        if self.samples_path.exists():
            yield from read_jsonl(self.samples_path, partial_last_line=True)  # a run may be writing it

    def metric_keys(self) -> set[str]:
        return {k for row in self.metrics for k in row}


def load_run(path: str | Path) -> Run:
    """Read a run folder (run.json required; metrics.jsonl optional, empty when absent).

    Raises:
        FileNotFoundError: the folder or its run.json is missing.
        ValueError: malformed JSON, naming the file (and line).
    """
    path = Path(path)
    cfg_path = path / "run.json"
    if not cfg_path.exists():
        raise FileNotFoundError(f"{path} is not a run folder: {cfg_path} does not exist")
    try:
        config = json.loads(cfg_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{cfg_path}: invalid JSON ({e.msg})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{cfg_path}: expected a JSON object")
    metrics_path = path / "metrics.jsonl"
    metrics = read_jsonl(metrics_path, partial_last_line=True) if metrics_path.exists() else []
    for i, row in enumerate(metrics):
        step = row.get("step")
        if isinstance(step, bool) or not isinstance(step, (int, float)) or not math.isfinite(step):
            raise ValueError(f"{metrics_path}: row {i + 1} has step={step!r}; expected an integer")
    summary, evals = (
        read_jsonl(p, partial_last_line=True) if p.exists() else []
        for p in (path / "summary.jsonl", path / "eval.jsonl")
    )
    legacy_summary = [r for r in metrics if "train_runtime" in r]  # run folders of earlier versions
    legacy_evals = [r for r in metrics if "train_runtime" not in r and any(k.startswith("eval_") for k in r)]
    if legacy_summary or legacy_evals:
        metrics = [r for r in metrics if not any(r is x for x in (*legacy_summary, *legacy_evals))]
    return Run(path, config, metrics, legacy_summary + summary, legacy_evals + evals)


def find_run_dirs(paths: Sequence[str | Path], *, max_depth: int = 3) -> list[Path]:
    """Run folders named by ``paths``: a folder with run.json, or a folder whose sub-folders (up to
    ``max_depth`` levels down) contain run folders (e.g. a demo's output folder).

    Raises:
        FileNotFoundError: a path that does not exist or contains no run folder.
    """
    out: list[Path] = []
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise FileNotFoundError(f"run folder {p} does not exist")
        if (p / "run.json").exists():
            out.append(p)
            continue
        found = sorted(
            f.parent
            for depth in range(1, max_depth + 1)
            for f in p.glob("/".join(["*"] * depth) + "/run.json")
        )
        if not found:
            raise FileNotFoundError(f"{p} has no run.json (and no run folder below it)")
        out.extend(found)
    seen, unique = set(), []
    for p in out:
        r = p.resolve()
        if r not in seen:
            seen.add(r)
            unique.append(p)
    return unique


def group_by_method(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """Runs grouped by method label; response-level methods first, then by name; seeds sorted.

    Raises:
        ValueError: two different method keys with the same label (set ``label`` in run.json).
    """
    groups: dict[str, list[Run]] = {}
    keys: dict[str, tuple] = {}
    for run in runs:
        label = run.label
        key = method_key(run.config)
        if label in keys and keys[label] != key and not run.config.get("label"):
            raise ValueError(f"runs {keys[label]} and {key} share the label {label!r}")
        keys.setdefault(label, key)
        groups.setdefault(label, []).append(run)

    def order(label: str) -> tuple:
        _, credit, _ = keys[label]
        return (credit != "uniform", label)

    def seed_order(run: Run) -> tuple:
        s = run.seed
        return (not isinstance(s, (int, float)), s if isinstance(s, (int, float)) else 0, str(run.path))

    return {label: sorted(groups[label], key=seed_order) for label in sorted(groups, key=order)}
