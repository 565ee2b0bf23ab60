"""The demo pipeline: warm starts (a shared copy phase, then one imperfect phase per warm start) -> RL runs
(every method x warm start x seed, in parallel worker processes) -> held-out evaluation -> statistics
(medians, two-level bootstrap of every method − GDPO over warm starts and seeds, claims) -> report."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mrtpo.demo.resume import claim_folder, clear_unfinished, load_result, save_result
from mrtpo.demo.runs import DEFAULT_METHODS, METHODS, RLConfig
from mrtpo.demo.warmstart import WarmStartConfig, heldout_examples

SATISFACTION_KEY = "task/satisfaction"

COPY_RESULT = "copy_phase.done.json"
"""Beside ``copy_phase.pt``: the copy phase finished (with the settings it names)."""

RETEST_SEED = 1_000
"""The second held-out evaluation of a final policy samples with the RL seed + this."""


@dataclass
class DemoConfig:
    """Everything ``mrtpo demo`` does; :func:`quick_config` is the ``--quick`` preset.

    The design crosses warm starts with RL seeds: every method trains from every warm start with every
    RL seed, and differences between methods are read per (warm start, seed) unit and resampled over
    both (:func:`mrtpo.analysis.stats.two_level_bootstrap`).
    """

    output_dir: str = field(default="mrtpo-demo", metadata={"help": "output folder"})
    warm_starts: tuple[int, ...] = field(
        default=(0, 1, 2),
        metadata={
            "help": "warm starts: seeds of their imperfect phase (they share the copy phase); at least 3 "
            "give an interval over warm starts"
        },
    )
    seeds: tuple[int, ...] = field(
        default=(0, 1), metadata={"help": "RL seeds (each method runs each seed from each warm start)"}
    )
    methods: tuple[str, ...] = field(default=DEFAULT_METHODS, metadata={"help": "methods to train"})
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    warm_start_dir: str | None = field(
        default=None,
        metadata={
            "help": "reuse warm starts: an earlier demo's DIR/warmstart (its ws<w> folders) or one warm-start "
            "folder"
        },
    )
    rl: RLConfig = field(default_factory=RLConfig)
    threshold: float = field(
        default=0.9, metadata={"help": "satisfaction level of the steps-to-threshold table"}
    )
    smooth: int = field(
        default=5, metadata={"help": "trailing mean over logged steps before the threshold test"}
    )
    eval_examples: int = field(default=256, metadata={"help": "held-out prompts for the final evaluation"})
    explain_records: int = field(default=4, metadata={"help": "MRTPO responses shown with per-token credit"})
    threads: int = field(
        default=1,
        metadata={
            "help": "torch CPU threads of the copy phase, and of every job when workers is 1 (1: on cores shared "
            "with other work, 2 threads ran the copy phase several times slower than 1)"
        },
    )
    workers: int = field(
        default_factory=lambda: os.cpu_count() or 1,
        metadata={
            "help": "parallel jobs (warm starts' imperfect phases, RL runs), one process and one torch thread "
            "each (default: CPU cores)"
        },
    )
    bootstrap_seed: int = field(default=0, metadata={"help": "seed of the bootstrap resampling"})
    smoke: str | None = field(
        default=None,
        metadata={"help": "set by --quick: the pages and the table say the numbers are a smoke run's"},
    )
    progress: bool = field(default=True, metadata={"help": "progress bars"})

    def __post_init__(self) -> None:
        bad = [m for m in self.methods if m not in METHODS]
        if bad:
            raise ValueError(f"methods: unknown {bad}; known: {sorted(METHODS)}")
        if not self.seeds:
            raise ValueError("seeds must name at least one seed")
        if not self.warm_starts:
            raise ValueError("warm_starts must name at least one warm start")
        for name in ("seeds", "warm_starts"):
            values = getattr(self, name)
            if len(set(values)) != len(values):
                raise ValueError(f"{name} has a repeated value: {list(values)}")
            if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in values):
                raise ValueError(f"{name} must be non-negative integers, got {list(values)}")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        if self.smooth < 1 or self.threads < 1 or self.eval_examples < 1 or self.workers < 1:
            raise ValueError(
                "smooth, threads, workers and eval_examples must be >= 1, got "
                f"{self.smooth}, {self.threads}, {self.workers}, {self.eval_examples}"
            )


def quick_config(output_dir: str = "mrtpo-demo-quick", **overrides: Any) -> DemoConfig:
    """The ``--quick`` preset: a short copy phase and two short warm starts (the model does not yet copy
    words reliably), one RL seed, a few RL steps, in this process; it exercises every part of the
    pipeline (the two-level bootstrap included) in well under a minute, not the learning."""
    cfg = {
        "output_dir": output_dir,
        "warm_starts": (0, 1),
        "seeds": (0,),
        "workers": 1,
        "threads": 1,
        "warm_start": WarmStartConfig(
            steps=120, clean_steps=80, batch_size=128, warmup_steps=20, eval_examples=64, eval_every=0
        ),
        "rl": RLConfig(steps=6, prompts_per_step=4, num_generations=4, log_samples=4, curve_every=3),
        "eval_examples": 64,
        "smooth": 1,
        "explain_records": 2,
        "smoke": "mrtpo demo --quick: 2 short warm starts, 1 RL seed, 6 RL steps",
    }
    cfg.update(overrides)
    return DemoConfig(**cfg)


def _finite(x: Any) -> Any:
    return None if isinstance(x, float) and not math.isfinite(x) else x


def _bar(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="run", disable=not enabled)


def prepare_warm_start(job: dict[str, Any]) -> dict[str, Any]:
    """One warm start's imperfect phase (:func:`mrtpo.demo.warmstart.train_imperfect_phase`) and its
    held-out evaluation (runs in a worker process, or in-process with one worker).

    ``job``: ``warm_start`` (its seed), ``config`` (:class:`WarmStartConfig`), ``copy_phase`` (path),
    ``dir``, ``eval_examples``, ``threads`` (None: leave as is), ``reuse`` (load ``dir`` instead).

    Returns:
        ``{"warm_start", "dir", "seconds", "cpu_seconds", "heldout", "sampled", "greedy", "final_loss",
        "curve"}``.
    """
    import torch

    from mrtpo.demo.warmstart import evaluate_policy, load_warm_start, train_imperfect_phase

    own = not job.get("reuse")  # a folder of this demo's (not an earlier demo's warm start)
    if own:
        done = load_result(job["dir"], job)
        if done is not None:
            return done
        clear_unfinished(job["dir"])
    if job.get("threads"):
        torch.set_num_threads(job["threads"])
    _quiet_loading()
    cpu0, t0 = time.process_time(), time.perf_counter()
    if job.get("reuse"):
        model, tok, info = load_warm_start(job["dir"])
    else:
        model, tok, info = train_imperfect_phase(
            job["config"], job["copy_phase"], job["warm_start"], job["dir"], progress=False
        )
    heldout, _ = evaluate_policy(model, tok, heldout_examples(job["eval_examples"]), temperature=1.0, seed=0)
    result = {
        "warm_start": job["warm_start"],
        "dir": str(job["dir"]),
        "reused": bool(job.get("reuse")),
        "seconds": time.perf_counter() - t0,
        "cpu_seconds": time.process_time() - cpu0,
        "heldout": heldout,
        **{k: info.get(k) for k in ("sampled", "greedy", "final_loss", "curve", "parameters")},
    }
    if own:
        save_result(job["dir"], job, result)
    return result


def train_and_evaluate(job: dict[str, Any]) -> dict[str, Any]:
    """One RL run and its held-out evaluation (runs in a worker process, or in-process with one worker).

    ``job``: ``method``, ``warm_start``, ``seed``, ``rl`` (:class:`RLConfig`), ``warm_start_dir``,
    ``run_dir``, ``eval_examples``, ``threshold``, ``smooth``, ``threads`` (torch threads; None: leave as is).

    Returns:
        ``{"method", "warm_start", "seed", "run_dir", "seconds", "curve_seconds", "cpu_seconds",
        "heldout", "heldout_retest", "heldout_greedy", "retest_seconds", "train_last", "steps", "curves"}``
        (``curves``: :func:`mrtpo.demo.dynamics.run_curves`, None without them).
    """
    import torch

    from mrtpo.analysis.runs import read_jsonl
    from mrtpo.demo.dynamics import run_curves
    from mrtpo.demo.runs import run_one
    from mrtpo.demo.summary import METRICS, steps_to_threshold
    from mrtpo.demo.warmstart import evaluate_policy, load_warm_start

    done = load_result(job["run_dir"], job)
    if done is not None:
        return done
    clear_unfinished(job["run_dir"])  # a run stopped before its end starts again
    if job.get("threads"):
        torch.set_num_threads(job["threads"])
    _quiet_loading()
    cpu0 = time.process_time()
    rl = job["rl"]
    res = run_one(job["method"], job["seed"], rl, job["warm_start_dir"], job["run_dir"], progress=False)
    trainer = res.pop("trainer")
    _, tok, _ = load_warm_start(job["warm_start_dir"])
    examples = heldout_examples(job["eval_examples"])
    metrics, _ = evaluate_policy(trainer.model, tok, examples, temperature=1.0, seed=job["seed"])
    res["heldout"] = metrics
    if job.get("retest", True):  # the end point read twice more: another sampling seed, greedy decoding
        t0 = time.perf_counter()
        res["heldout_retest"], _ = evaluate_policy(
            trainer.model, tok, examples, temperature=1.0, seed=job["seed"] + RETEST_SEED
        )
        res["heldout_greedy"], _ = evaluate_policy(trainer.model, tok, examples, temperature=0.0)
        res["retest_seconds"] = time.perf_counter() - t0
    del trainer
    rows = read_jsonl(Path(job["run_dir"]) / "metrics.jsonl")
    res["warm_start"] = job["warm_start"]
    res["train_last"] = _last_metric(rows, SATISFACTION_KEY)
    res["steps"] = {
        row: steps_to_threshold(rows, key, job["threshold"], job["smooth"]) for row, key, _ in METRICS
    }
    res["curves"] = run_curves(rows, rl.curve_every, rl.steps) if rl.curve_every > 0 else None
    res["cpu_seconds"] = time.process_time() - cpu0
    result = {"method": res.pop("method"), "warm_start": res.pop("warm_start"), **res}
    save_result(job["run_dir"], job, result)
    return result


def _run_jobs(
    ws_jobs: list[dict[str, Any]],
    rl_jobs: dict[int, list[dict[str, Any]]],
    workers: int,
    progress: bool,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every warm start's job, and each warm start's RL jobs as soon as it is ready, in ``workers``
    processes (in this process when 1).

    Returns:
        ``(warm start results in job order, RL results in the order of the flattened rl_jobs)``.
    """
    order = [(w, i) for w in rl_jobs for i in range(len(rl_jobs[w]))]
    index = {key: n for n, key in enumerate(order)}
    bar = _bar(len(ws_jobs) + len(order), "warm starts + RL runs", progress)
    ws_results: dict[int, dict[str, Any]] = {}
    results: list[dict[str, Any] | None] = [None] * len(order)
    if workers <= 1:
        for job in ws_jobs:
            bar.set_postfix(warm_start=job["warm_start"])
            ws_results[job["warm_start"]] = prepare_warm_start(job)
            bar.update(1)
        for w, i in order:
            job = rl_jobs[w][i]
            bar.set_postfix(method=job["method"], warm_start=w, seed=job["seed"])
            results[index[(w, i)]] = train_and_evaluate(job)
            bar.update(1)
    else:
        import multiprocessing as mp
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

        # spawn: a fresh interpreter per worker (no forked torch thread pools); one torch thread each
        with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
            pending = {
                pool.submit(prepare_warm_start, {**job, "threads": 1}): ("ws", job["warm_start"], None)
                for job in ws_jobs
            }
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    kind, w, i = pending.pop(fut)
                    res = fut.result()
                    if kind == "ws":
                        ws_results[w] = res
                        bar.set_postfix(done=f"warm start {w}")
                        for j, job in enumerate(rl_jobs.get(w, [])):  # its RL runs can start now
                            pending[pool.submit(train_and_evaluate, {**job, "threads": 1})] = ("rl", w, j)
                    else:
                        results[index[(w, i)]] = res
                        job = rl_jobs[w][i]
                        bar.set_postfix(done=f"{job['method']} ws{w} seed {job['seed']}")
                    bar.update(1)
    bar.close()
    return [ws_results[j["warm_start"]] for j in ws_jobs], [r for r in results if r is not None]


def find_warm_starts(path: str | Path) -> dict[int, Path]:
    """The warm starts in ``path``: ``{warm start: folder}`` for its ``ws<w>`` sub-folders (an earlier
    demo's ``DIR/warmstart``), or ``{w: path}`` when ``path`` is itself a warm-start folder (``w`` from
    its warmstart.json, 0 for folders of earlier versions).

    Raises:
        FileNotFoundError: neither.
    """
    path = Path(path)
    if (path / "warmstart.json").exists():
        info = json.loads((path / "warmstart.json").read_text())
        return {int(info.get("warm_start", 0)): path}
    found = {}
    for sub in sorted(path.glob("ws*")):
        if (sub / "warmstart.json").exists() and sub.name[2:].isdigit():
            found[int(sub.name[2:])] = sub
    if not found:
        raise FileNotFoundError(
            f"{path} is not a warm-start folder (no warmstart.json, no ws<w>/warmstart.json)"
        )
    return dict(sorted(found.items()))


def _quiet_loading() -> None:
    """No per-file "Loading weights" bar of transformers when a job loads a warm start (many jobs)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def _load_avg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:  # not available on this platform
        return "?"


def run_demo(config: DemoConfig, *, overwrite: bool = False) -> dict[str, Any]:
    """Run the demo; returns the summary (also written to ``<output_dir>/summary.json``).

    The same command run again into its folder resumes it: finished units are reused, verified by their
    settings (:mod:`mrtpo.demo.resume`); another command into a used folder is refused unless ``overwrite``.

    Raises:
        FileExistsError: the output folder holds another command's demo (or other files), without
            ``overwrite``.
    """
    import platform

    import torch

    from mrtpo.demo.summary import method_label

    torch.set_num_threads(config.threads)
    out = Path(config.output_dir)
    claim_folder(out, config, overwrite=overwrite)
    load_before = _load_avg()
    t_start = time.perf_counter()
    timings: dict[str, float] = {}

    # 1. warm starts: the shared copy phase here, the imperfect phases as jobs
    from mrtpo.demo.warmstart import train_copy_phase

    if config.warm_start_dir is not None:
        root = Path(config.warm_start_dir)
        copy = root / "copy_phase.pt"
        try:
            found = find_warm_starts(root)
        except FileNotFoundError:
            if not copy.exists():
                raise
            found = {}
        missing: list[int] = []
        if len(found) > 1 or copy.exists():  # an earlier demo's warm starts: those of config.warm_starts
            found = {w: d for w, d in found.items() if w in config.warm_starts}
            # the ones it lacks: their imperfect phase from its shared copy phase, when it has one
            missing = [w for w in config.warm_starts if w not in found] if copy.exists() else []
            if not found and not missing:
                raise FileNotFoundError(
                    f"{config.warm_start_dir} holds none of the warm starts {list(config.warm_starts)} (and no "
                    "copy_phase.pt to train them from)"
                )
        ws_jobs = [
            {"warm_start": w, "dir": str(d), "reuse": True, "eval_examples": config.eval_examples}
            for w, d in found.items()
        ]
        ws_jobs += [
            {
                "warm_start": w,
                "config": config.warm_start,
                "copy_phase": str(copy),
                "dir": str(out / "warmstart" / f"ws{w}"),
                "eval_examples": config.eval_examples,
            }
            for w in missing
        ]
        ws_jobs.sort(
            key=lambda j: (
                config.warm_starts.index(j["warm_start"]) if j["warm_start"] in config.warm_starts else -1
            )
        )
        copy_seconds = 0.0
    else:
        ws_root = out / "warmstart"
        t0 = time.perf_counter()
        copy_job = {"config": config.warm_start}
        done = load_result(ws_root, copy_job, COPY_RESULT)
        if done is not None and (ws_root / "copy_phase.pt").exists():
            copy = ws_root / "copy_phase.pt"
        else:
            copy = train_copy_phase(config.warm_start, ws_root, progress=config.progress)
            save_result(ws_root, copy_job, {"path": str(copy)}, COPY_RESULT)
        copy_seconds = time.perf_counter() - t0
        ws_jobs = [
            {
                "warm_start": w,
                "config": config.warm_start,
                "copy_phase": str(copy),
                "dir": str(ws_root / f"ws{w}"),
                "eval_examples": config.eval_examples,
            }
            for w in config.warm_starts
        ]
    ws_dirs = {j["warm_start"]: j["dir"] for j in ws_jobs}

    # 2. RL runs: every method from every warm start with every seed, as soon as its warm start is ready
    methods = list(dict.fromkeys(config.methods))
    rl_jobs = {
        w: [
            {
                "method": method,
                "warm_start": w,
                "seed": seed,
                "rl": config.rl,
                "warm_start_dir": ws_dirs[w],
                "run_dir": str(out / "runs" / f"ws{w}" / f"{method}-seed{seed}"),
                "eval_examples": config.eval_examples,
                "threshold": config.threshold,
                "smooth": config.smooth,
                "threads": None,
            }
            for seed in config.seeds
            for method in methods
        ]
        for w in ws_dirs
    }
    workers = min(config.workers, len(ws_jobs) + sum(map(len, rl_jobs.values())))
    t0 = time.perf_counter()
    warm_starts, runs = _run_jobs(ws_jobs, rl_jobs, workers, config.progress)
    timings["copy_phase"] = copy_seconds
    timings["jobs"] = time.perf_counter() - t0  # the imperfect phases and the RL runs overlap in the pool

    # 3. statistics and report
    t0 = time.perf_counter()
    from mrtpo.demo.aggregate import build_summary

    summary = build_summary(
        runs,
        warm_starts,
        methods=methods,
        seeds=config.seeds,
        steps_cap=config.rl.steps,
        threshold=config.threshold,
        smooth=config.smooth,
        eval_examples=config.eval_examples,
        bootstrap_seed=config.bootstrap_seed,
    )
    from mrtpo.demo.report import write_report

    main_methods = [m for m in methods if not m.startswith("mrtpo-beta")]
    beta_methods = [m for m in methods if m == "mrtpo" or m.startswith("mrtpo-beta")]

    def dirs(m: str) -> list[str]:
        return [r["run_dir"] for r in runs if r["method"] == m]

    report = write_report(
        out,
        [r["run_dir"] for r in runs if r["method"] in main_methods],
        threshold=config.threshold,
        smooth=config.smooth,
        n_explain=config.explain_records,
        curve_groups={
            "main": {method_label(m): dirs(m) for m in main_methods},
            **(
                {"beta": {method_label(m): dirs(m) for m in beta_methods}}
                if any(m.startswith("mrtpo-beta") for m in methods)
                else {}
            ),
        },
        notes=[_smoke_note(config)] if config.smoke else [],
        summary=summary,
    )
    timings["report"] = time.perf_counter() - t0
    timings["total"] = time.perf_counter() - t_start

    summary = {
        "config": _config_dict(config),
        "smoke": config.smoke,
        "machine": {
            "cpus": os.cpu_count(),
            "workers": workers,
            "threads": 1 if workers > 1 else config.threads,
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "torch": torch.__version__,
            "load_before": load_before,
            "load_after": _load_avg(),
        },
        **summary,
        "timings": timings,
        "cpu_seconds": {
            "imperfect_phases": sum(w["cpu_seconds"] for w in warm_starts),
            "rl_runs": sum(r["cpu_seconds"] for r in runs),
        },
        "recording": recording_cost(runs),
        "wall_seconds": timings["total"],
        "files": report["files"],
    }
    (out / "summary.json").write_text(json.dumps(_json_safe(summary), indent=1))
    (out / "index.html").write_text(_index_html(summary))
    return summary


def recording_cost(runs: list[dict[str, Any]]) -> dict[str, float]:
    """What recording the curves and the extra end-point evaluations cost: their seconds and their share
    of the RL runs' seconds (training and every evaluation; the runs' ``seconds`` include the curves)."""
    curves = sum(r.get("curve_seconds") or 0.0 for r in runs)
    extra = sum(r.get("retest_seconds") or 0.0 for r in runs)
    total = sum(r.get("seconds") or 0.0 for r in runs) + extra
    return {
        "curve_seconds": curves,
        "retest_seconds": extra,
        "run_seconds": total,
        "share": (curves + extra) / total if total > 0 else 0.0,
    }


def _smoke_note(config: DemoConfig) -> str:
    return (
        f"Smoke run ({config.smoke}): these numbers check that every step of the pipeline works; they say "
        "nothing about the methods."
    )


def _config_dict(config: DemoConfig) -> dict[str, Any]:
    d = asdict(config)
    d["seeds"], d["methods"] = list(config.seeds), list(config.methods)
    d["warm_starts"] = list(config.warm_starts)
    return d


def _config_dict_pooled(first: dict[str, Any], summary: dict[str, Any], methods: list[str]) -> dict[str, Any]:
    """The config of a pooled summary: the first summary's, with the pooled design."""
    return {
        **first,
        "warm_starts": list(summary["design"]["warm_starts"]),
        "seeds": list(summary["design"]["seeds"]),
        "methods": list(methods),
    }


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return _finite(obj)


def _last_metric(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [float(r[key]) for r in rows if r.get(key) is not None]
    return vals[-1] if vals else None


def _index_html(summary: dict[str, Any]) -> str:
    from mrtpo.demo.report import index_html

    return index_html(summary)
