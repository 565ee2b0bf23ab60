"""The demo pipeline: warm start -> GRPO / GDPO / MRTPO runs per seed -> held-out evaluation -> report."""

from __future__ import annotations

import html
import json
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mrtpo.demo.runs import METHODS, RLConfig
from mrtpo.demo.warmstart import WarmStartConfig

SATISFACTION_KEY = "task/satisfaction"


@dataclass
class DemoConfig:
    """Everything ``mrtpo demo`` does; :func:`quick_config` is the ``--quick`` preset."""

    output_dir: str = field(default="mrtpo-demo", metadata={"help": "output folder"})
    seeds: tuple[int, ...] = field(
        default=(0, 1, 2), metadata={"help": "RL seeds (each method runs each seed)"}
    )
    methods: tuple[str, ...] = field(default=("grpo", "gdpo", "mrtpo"), metadata={"help": "methods to train"})
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
        default=2, metadata={"help": "torch CPU threads (1 is faster on a machine whose cores are busy)"}
    )
    progress: bool = field(default=True, metadata={"help": "progress bars"})

    def __post_init__(self) -> None:
        bad = [m for m in self.methods if m not in METHODS]
        if bad:
            raise ValueError(f"methods: unknown {bad}; known: {sorted(METHODS)}")
        if not self.seeds:
            raise ValueError("seeds must name at least one seed")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        if self.smooth < 1 or self.threads < 1 or self.eval_examples < 1:
            raise ValueError(
                f"smooth, threads and eval_examples must be >= 1, got {self.smooth}, {self.threads}, {self.eval_examples}"
            )


def quick_config(output_dir: str = "mrtpo-demo-quick", **overrides: Any) -> DemoConfig:
    """The ``--quick`` preset: a short warm start (the model does not yet copy words reliably), one
    seed, a few RL steps; it exercises every part of the pipeline in about 20 seconds, not the learning."""
    cfg = {
        "output_dir": output_dir,
        "seeds": (0,),
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


def _bar(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="run", disable=not enabled)


def _finite(x: Any) -> Any:
    return None if isinstance(x, float) and not math.isfinite(x) else x


def run_demo(config: DemoConfig) -> dict[str, Any]:
    """Run the demo; returns the summary (also written to ``<output_dir>/summary.json``)."""
    import torch

    torch.set_num_threads(config.threads)
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    timings: dict[str, float] = {}

    # 1. warm start
    from mrtpo.demo.warmstart import evaluate_policy, load_warm_start, train_warm_start
    from mrtpo.tasks.toy import generate_examples

    if config.warm_start_dir is not None:
        ws_dir = Path(config.warm_start_dir)
        model, tok, ws_info = load_warm_start(ws_dir)
        timings["warm_start"] = 0.0
    else:
        ws_dir = out / "warmstart"
        t0 = time.perf_counter()
        model, tok, ws_info = train_warm_start(config.warm_start, ws_dir, progress=config.progress)
        timings["warm_start"] = time.perf_counter() - t0

    test = generate_examples(config.eval_examples, seed=20_000, prefix="heldout")
    evaluation: dict[str, Any] = {"warm start": evaluate_policy(model, tok, test, temperature=1.0, seed=0)[0]}
    del model

    # 2. RL runs
    from mrtpo.demo.runs import run_one

    runs: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    bar = _bar(len(config.seeds) * len(config.methods), "RL runs", config.progress)
    for seed in config.seeds:
        for method in config.methods:
            bar.set_postfix(method=method, seed=seed)
            run_dir = out / "runs" / f"{method}-seed{seed}"
            res = run_one(method, seed, config.rl, ws_dir, run_dir, progress=config.progress)
            trainer = res.pop("trainer")
            policy = trainer.model
            metrics, _ = evaluate_policy(policy, tok, test, temperature=1.0, seed=seed)
            res["heldout"] = metrics
            res["train_last"] = _last_metric(run_dir / "metrics.jsonl", SATISFACTION_KEY)
            runs.append(res)
            del trainer, policy
            bar.update(1)
    bar.close()
    timings["rl"] = time.perf_counter() - t0

    # 3. report
    t0 = time.perf_counter()
    from mrtpo.demo.report import write_report

    report = write_report(
        out,
        [r["run_dir"] for r in runs],
        threshold=config.threshold,
        smooth=config.smooth,
        n_explain=config.explain_records,
    )
    timings["report"] = time.perf_counter() - t0
    timings["total"] = time.perf_counter() - t_start

    summary = {
        "config": _config_dict(config),
        "warm_start": {"dir": str(ws_dir), **{k: v for k, v in ws_info.items() if k != "config"}},
        "heldout_warm_start": evaluation["warm start"],
        "runs": runs,
        "steps_to_threshold": report["steps_to_threshold"],
        "threshold": config.threshold,
        "metric": SATISFACTION_KEY,
        "smooth": config.smooth,
        "timings": timings,
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


def _last_metric(path: Path, key: str) -> float | None:
    last = None
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                if row.get(key) is not None:
                    last = float(row[key])
    return last


def summary_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per run: method, seed, held-out satisfaction (and per constraint), last training value,
    steps to threshold, seconds."""
    steps = {}
    for entry in summary["steps_to_threshold"].values():
        for s in entry.get("seeds", []):
            steps[Path(s["run"]).name] = s["steps"]
    rows = []
    for r in summary["runs"]:
        h = r["heldout"]
        rows.append(
            {
                "method": r["method"],
                "seed": r["seed"],
                "satisfaction": h["satisfaction"],
                "all_met": h["all_met"],
                **{k: h.get(k) for k in ("start", "end", "include", "length", "wrap")},
                "train_last": r["train_last"],
                "steps_to_threshold": steps.get(Path(r["run_dir"]).name),
                "seconds": r["seconds"],
            }
        )
    return rows


def format_table(summary: dict[str, Any]) -> str:
    """The summary as a plain-text table (printed at the end of ``mrtpo demo``)."""
    rows = summary_rows(summary)
    thr = summary["threshold"]
    head = f"{'method':<7} {'seed':>4} {'heldout sat':>11} {'all met':>7} {'train last':>10} {'steps to ' + str(thr):>12} {'sec':>6}"
    lines = [head, "-" * len(head)]
    w = summary["heldout_warm_start"]
    lines.append(
        f"{'warm':<7} {'-':>4} {w['satisfaction']:>11.3f} {w['all_met']:>7.3f} {'-':>10} {'-':>12} {'-':>6}"
    )
    for r in rows:
        st = "not reached" if r["steps_to_threshold"] is None else str(r["steps_to_threshold"])
        tl = "-" if r["train_last"] is None else f"{r['train_last']:.3f}"
        lines.append(
            f"{r['method']:<7} {r['seed']:>4} {r['satisfaction']:>11.3f} {r['all_met']:>7.3f} {tl:>10} {st:>12} {r['seconds']:>6.0f}"
        )
    lines.append("-" * len(head))
    for m in dict.fromkeys(r["method"] for r in rows):
        sats = [r["satisfaction"] for r in rows if r["method"] == m]
        steps = sorted(
            math.inf if r["steps_to_threshold"] is None else r["steps_to_threshold"]
            for r in rows
            if r["method"] == m
        )
        med = (
            steps[len(steps) // 2]
            if len(steps) % 2
            else (steps[len(steps) // 2 - 1] + steps[len(steps) // 2]) / 2
        )
        spread = f" ± {statistics.stdev(sats):.3f}" if len(sats) > 1 else ""
        med_s = "not reached" if math.isinf(med) else f"{med:g}"
        lines.append(
            f"{m:<7} mean heldout satisfaction {statistics.mean(sats):.3f}{spread} over {len(sats)} seed(s); "
            f"median steps to {thr}: {med_s}"
        )
    return "\n".join(lines)


def _index_html(summary: dict[str, Any]) -> str:
    files = summary["files"]
    t = summary["timings"]
    ws = summary["warm_start"]
    links = "".join(
        f'<li><a href="{html.escape(files[k])}">{html.escape(label)}</a></li>'
        for k, label in (
            ("report", "report: reward curves, steps to threshold, localization"),
            ("explain", "per-token credit of a few responses: GDPO vs MRTPO"),
        )
        if files.get(k)
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>mrtpo demo</title></head>"
        "<body style='font-family:sans-serif;max-width:60em'>"
        "<h1>mrtpo demo</h1>"
        f"<ul>{links}</ul>"
        f"<p>Warm start: {ws.get('parameters', '?')} parameters, {ws.get('seconds', 0):.0f} s. "
        f"RL runs: {t.get('rl', 0):.0f} s. Total: {t.get('total', 0):.0f} s.</p>"
        "<p>Held-out satisfaction: mean share of a prompt's own constraints met by a sampled response "
        f"(temperature 1, {summary['config']['eval_examples']} prompts). Steps to threshold: first step at which "
        f"the trailing {summary['smooth']}-step mean of the training satisfaction reaches {summary['threshold']}.</p>"
        f"<pre>{html.escape(format_table(summary))}</pre>"
        + (
            f'<img src="{html.escape(files["curves.png"])}" style="max-width:100%">'
            if files.get("curves.png")
            else ""
        )
        + "</body></html>"
    )
