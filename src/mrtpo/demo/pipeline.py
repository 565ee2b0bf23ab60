"""The demo pipeline: warm start -> RL runs (every method x seed, in parallel worker processes) ->
held-out evaluation -> statistics (medians, paired bootstrap of MRTPO − GDPO) -> report."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mrtpo.demo.runs import DEFAULT_METHODS, METHODS, RLConfig
from mrtpo.demo.warmstart import WarmStartConfig

SATISFACTION_KEY = "task/satisfaction"


@dataclass
class DemoConfig:
    """Everything ``mrtpo demo`` does; :func:`quick_config` is the ``--quick`` preset."""

    output_dir: str = field(default="mrtpo-demo", metadata={"help": "output folder"})
    seeds: tuple[int, ...] = field(
        default=(0, 1, 2, 3, 4), metadata={"help": "RL seeds (each method runs each seed)"}
    )
    methods: tuple[str, ...] = field(default=DEFAULT_METHODS, metadata={"help": "methods to train"})
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    warm_start_dir: str | None = field(
        default=None, metadata={"help": "reuse this warm-start folder instead of training one"}
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
        default=2,
        metadata={"help": "torch CPU threads of the warm start, and of the RL runs when workers is 1"},
    )
    workers: int = field(
        default_factory=lambda: os.cpu_count() or 1,
        metadata={"help": "parallel RL runs, one process and one torch thread each (default: CPU cores)"},
    )
    bootstrap_seed: int = field(default=0, metadata={"help": "seed of the bootstrap resampling"})
    progress: bool = field(default=True, metadata={"help": "progress bars"})

    def __post_init__(self) -> None:
        bad = [m for m in self.methods if m not in METHODS]
        if bad:
            raise ValueError(f"methods: unknown {bad}; known: {sorted(METHODS)}")
        if not self.seeds:
            raise ValueError("seeds must name at least one seed")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        if self.smooth < 1 or self.threads < 1 or self.eval_examples < 1 or self.workers < 1:
            raise ValueError(
                "smooth, threads, workers and eval_examples must be >= 1, got "
                f"{self.smooth}, {self.threads}, {self.workers}, {self.eval_examples}"
            )


def quick_config(output_dir: str = "mrtpo-demo-quick", **overrides: Any) -> DemoConfig:
    """The ``--quick`` preset: a short warm start (the model does not yet copy words reliably), two
    seeds, a few RL steps, in this process; it exercises every part of the pipeline (the bootstrap
    included) in well under a minute, not the learning."""
    cfg = {
        "output_dir": output_dir,
        "seeds": (0, 1),
        "workers": 1,
        "threads": 1,
        "warm_start": WarmStartConfig(
            steps=120, clean_steps=80, batch_size=128, warmup_steps=20, eval_examples=64
        ),
        "rl": RLConfig(steps=6, prompts_per_step=4, num_generations=4, log_samples=4),
        "eval_examples": 64,
        "smooth": 1,
        "explain_records": 2,
    }
    cfg.update(overrides)
    return DemoConfig(**cfg)


def _finite(x: Any) -> Any:
    return None if isinstance(x, float) and not math.isfinite(x) else x


def _bar(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="run", disable=not enabled)


def heldout_examples(n: int):
    """The held-out prompts of the final evaluation (the same for every run)."""
    from mrtpo.tasks.toy import generate_examples

    return generate_examples(n, seed=20_000, prefix="heldout")


def train_and_evaluate(job: dict[str, Any]) -> dict[str, Any]:
    """One RL run and its held-out evaluation (runs in a worker process, or in-process with one worker).

    ``job``: ``method``, ``seed``, ``rl`` (:class:`RLConfig`), ``warm_start_dir``, ``run_dir``,
    ``eval_examples``, ``threshold``, ``smooth``, ``threads`` (torch threads; None: leave as is).

    Returns:
        ``{"method", "seed", "run_dir", "seconds", "cpu_seconds", "heldout", "train_last", "steps"}``.
    """
    import torch

    from mrtpo.analysis.runs import read_jsonl
    from mrtpo.demo.runs import run_one
    from mrtpo.demo.summary import METRICS, steps_to_threshold
    from mrtpo.demo.warmstart import evaluate_policy, load_warm_start

    if job.get("threads"):
        torch.set_num_threads(job["threads"])
    cpu0 = time.process_time()
    res = run_one(
        job["method"], job["seed"], job["rl"], job["warm_start_dir"], job["run_dir"], progress=False
    )
    trainer = res.pop("trainer")
    _, tok, _ = load_warm_start(job["warm_start_dir"])
    metrics, _ = evaluate_policy(
        trainer.model, tok, heldout_examples(job["eval_examples"]), temperature=1.0, seed=job["seed"]
    )
    del trainer
    rows = read_jsonl(Path(job["run_dir"]) / "metrics.jsonl")
    res["heldout"] = metrics
    res["train_last"] = _last_metric(rows, SATISFACTION_KEY)
    res["steps"] = {
        row: steps_to_threshold(rows, key, job["threshold"], job["smooth"]) for row, key, _ in METRICS
    }
    res["cpu_seconds"] = time.process_time() - cpu0
    return res


def _run_jobs(jobs: list[dict[str, Any]], workers: int, progress: bool) -> list[dict[str, Any]]:
    """Run the jobs in ``workers`` processes (in this process when 1); results in job order."""
    bar = _bar(len(jobs), "RL runs", progress)
    results: list[dict[str, Any] | None] = [None] * len(jobs)
    if workers <= 1:
        for i, job in enumerate(jobs):
            bar.set_postfix(method=job["method"], seed=job["seed"])
            results[i] = train_and_evaluate(job)
            bar.update(1)
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        # spawn: a fresh interpreter per worker (no forked torch thread pools); one torch thread each
        with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
            futures = {
                pool.submit(train_and_evaluate, {**job, "threads": 1}): i for i, job in enumerate(jobs)
            }
            for fut in as_completed(futures):
                i = futures[fut]
                results[i] = fut.result()
                bar.set_postfix(done=f"{jobs[i]['method']} seed {jobs[i]['seed']}")
                bar.update(1)
    bar.close()
    return [r for r in results if r is not None]


def run_demo(config: DemoConfig) -> dict[str, Any]:
    """Run the demo; returns the summary (also written to ``<output_dir>/summary.json``)."""
    import os
    import platform

    import torch

    from mrtpo.demo.summary import LABELS, compare, method_table

    torch.set_num_threads(config.threads)
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    timings: dict[str, float] = {}

    # 1. warm start
    from mrtpo.demo.warmstart import evaluate_policy, load_warm_start, train_warm_start

    if config.warm_start_dir is not None:
        ws_dir = Path(config.warm_start_dir)
        model, tok, ws_info = load_warm_start(ws_dir)
        timings["warm_start"] = 0.0
    else:
        ws_dir = out / "warmstart"
        t0 = time.perf_counter()
        model, tok, ws_info = train_warm_start(config.warm_start, ws_dir, progress=config.progress)
        timings["warm_start"] = time.perf_counter() - t0
    warm_eval = evaluate_policy(model, tok, heldout_examples(config.eval_examples), temperature=1.0, seed=0)[
        0
    ]
    del model

    # 2. RL runs, in parallel worker processes
    methods = list(dict.fromkeys(config.methods))
    jobs = [
        {
            "method": method,
            "seed": seed,
            "rl": config.rl,
            "warm_start_dir": str(ws_dir),
            "run_dir": str(out / "runs" / f"{method}-seed{seed}"),
            "eval_examples": config.eval_examples,
            "threshold": config.threshold,
            "smooth": config.smooth,
            "threads": None,
        }
        for seed in config.seeds
        for method in methods
    ]
    workers = min(config.workers, len(jobs))
    t0 = time.perf_counter()
    runs = _run_jobs(jobs, workers, config.progress)
    timings["rl"] = time.perf_counter() - t0

    # 3. statistics and report
    t0 = time.perf_counter()
    cap = config.rl.steps
    table = method_table(runs, methods, cap)
    comparison = compare(table, "mrtpo", "gdpo", cap, seed=config.bootstrap_seed)
    from mrtpo.demo.report import write_report

    main_methods = [m for m in methods if not m.startswith("mrtpo-beta")]
    report = write_report(
        out,
        [r["run_dir"] for r in runs if r["method"] in main_methods],
        threshold=config.threshold,
        smooth=config.smooth,
        n_explain=config.explain_records,
        curve_groups={
            "main": {LABELS[m]: [r["run_dir"] for r in runs if r["method"] == m] for m in main_methods},
            **(
                {
                    "beta": {
                        LABELS[m]: [r["run_dir"] for r in runs if r["method"] == m]
                        for m in methods
                        if m == "mrtpo" or m.startswith("mrtpo-beta")
                    }
                }
                if any(m.startswith("mrtpo-beta") for m in methods)
                else {}
            ),
        },
    )
    timings["report"] = time.perf_counter() - t0
    timings["total"] = time.perf_counter() - t_start

    summary = {
        "config": _config_dict(config),
        "machine": {
            "cpus": os.cpu_count(),
            "workers": workers,
            "threads": 1 if workers > 1 else config.threads,
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "torch": torch.__version__,
        },
        "warm_start": {"dir": str(ws_dir), **{k: v for k, v in ws_info.items() if k != "config"}},
        "heldout_warm_start": warm_eval,
        "threshold": config.threshold,
        "metric": SATISFACTION_KEY,
        "smooth": config.smooth,
        "eval_examples": config.eval_examples,
        "steps_cap": cap,
        "methods": table,
        "comparison": comparison,
        "runs": runs,
        "timings": timings,
        "wall_seconds": timings["total"],
        "files": report["files"],
    }
    (out / "summary.json").write_text(json.dumps(_json_safe(summary), indent=1))
    (out / "index.html").write_text(_index_html(summary))
    return summary


def _config_dict(config: DemoConfig) -> dict[str, Any]:
    d = asdict(config)
    d["seeds"], d["methods"] = list(config.seeds), list(config.methods)
    return d


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
