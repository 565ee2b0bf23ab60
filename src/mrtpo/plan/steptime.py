"""``mrtpo plan --device cpu`` against ``mrtpo train``'s measured steps on this machine, phase by phase.

``python -m mrtpo.plan.steptime [--threads 1] [--steps 12] [--repeat 1]`` runs each configuration of
:data:`CONFIGS` (the tiny recipe at hidden size 256 and 4 layers: completions of 48 and 96 tokens, replay on
and off, transformers' generate; with ``--vllm-python PYTHON``, also :data:`VLLM_CONFIGS`: the real vLLM CPU
engine colocated, ``recipes/tiny_vllm_cpu.yaml``, run by that interpreter) in a fresh process with
``torch.set_num_threads(threads)``, through the same ``train()`` as ``mrtpo train``, and times every optimizer step (a trainer callback) and its phases:
TRL's own profiling contexts (``transformers.generate``, or ``vLLM.generate`` and ``sync_weights``; ``_prepare_inputs``, the forwards of
``_get_per_token_logps_and_entropies`` run while preparing the inputs: the rollout and reference passes)
and mrtpo's replay (``MRTPOTrainer._replay``, timed by a wrapper in the measuring process). ``training`` is the step less
``_prepare_inputs`` (loss, backward, optimizer); ``other`` is the rest of ``_prepare_inputs`` (rewards,
advantages, decoding), which the plan does not model. The first ``--warmup`` steps are dropped; the median
of the others is compared with ``mrtpo plan RECIPE --device cpu --threads N -- OVERRIDES``.

Times are the process's CPU time (``time.process_time``), as :mod:`mrtpo.plan.device` measures its rates:
at one thread that is the step's wall time on an idle core; on a machine shared with other jobs it still
rises with their load, so the profile is measured again first (``--cached-profile`` reuses the cached one),
under the load the runs see, and the load average is printed before and after.

The plan is given two facts about a random model's behaviour that it cannot know (stated in the table):
the pass rate of its rewards (``--pass-rate``) and the mean completion length (``--response-tokens``);
both enter only the replay phase.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

RECIPE = "recipes/tiny_cpu.yaml"
BASE = ["--model.tiny.hidden_size", "256", "--model.tiny.num_layers", "4", "--trl.save_steps", "100000",
        "--trl.report_to", "[]", "--trl.logging_steps", "1"]  # fmt: skip
CONFIGS: dict[str, list[str]] = {
    "T48 replay": ["--trl.max_completion_length", "48", "--method.credit", "reward"],
    "T48 no replay": ["--trl.max_completion_length", "48", "--method.credit", "none"],
    "T96 replay": ["--trl.max_completion_length", "96", "--method.credit", "reward"],
    "T96 no replay": ["--trl.max_completion_length", "96", "--method.credit", "none"],
}
VLLM_RECIPE = "recipes/tiny_vllm_cpu.yaml"
VLLM_CONFIGS: dict[str, list[str]] = {  # run with --vllm-python (an environment with vLLM's CPU build)
    "vLLM T12 replay": ["--trl.save_steps", "100000", "--trl.report_to", "[]", "--trl.logging_steps", "1",
                        "--trl.max_completion_length", "12"],
}  # fmt: skip
GENERATION_SPANS = ("transformers.generate", "vLLM.generate", "sync_weights")  # TRL's names; the plan's phase
PASS_RATE = 0.05  # a random model's rewards: rarely met (observed: most replay pairs skipped)
RESPONSE_SHARE = 0.8  # a random model's mean completion over max_completion_length (observed: 37-39 of 48)
PHASES = ("generation", "rollout+reference", "replay", "training", "other")


def _child(recipe: str, overrides: list[str], threads: int, out: str) -> None:
    """Train in this process and write each step's phase times to ``out`` (JSON)."""
    import torch

    torch.set_num_threads(threads)
    from transformers import TrainerCallback
    from trl.extras import profiling

    from mrtpo.integrations.trl.recipe import train
    from mrtpo.integrations.trl.schema import load_config, parse_overrides

    spans: list[tuple[str, float, float]] = []
    enter, leave = profiling.ProfilingContext.__enter__, profiling.ProfilingContext.__exit__

    def timed_enter(self):
        self._mrtpo_t0 = time.process_time()
        return enter(self)

    def timed_exit(self, *exc):
        spans.append((self.name.split(".", 1)[-1], self._mrtpo_t0, time.process_time()))
        return leave(self, *exc)

    profiling.ProfilingContext.__enter__, profiling.ProfilingContext.__exit__ = timed_enter, timed_exit
    from mrtpo.integrations.trl.trainer import MRTPOTrainer

    replay = MRTPOTrainer._replay

    def timed_replay(self, *a, **kw):  # CPU time of replay (its metric replay/seconds is wall time)
        t0 = time.process_time()
        try:
            return replay(self, *a, **kw)
        finally:
            spans.append(("replay", t0, time.process_time()))

    MRTPOTrainer._replay = timed_replay
    steps: list[tuple[float, float]] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.process_time()

        def on_step_end(self, args, state, control, **kw):
            steps.append((self.t0, time.process_time()))

    pairs, _ = parse_overrides(overrides)
    cfg = load_config(recipe, pairs)
    trainer = train(cfg, overwrite=True, callbacks=[StepTimer()], save_final=False, log=lambda m: None)
    metrics = [
        json.loads(x) for x in (Path(trainer.args.output_dir) / "metrics.jsonl").read_text().splitlines()
    ]
    by_step = {
        int(m["step"]): m for m in metrics if ("step" in m and "replay/seconds" in m) or "step_time" in m
    }
    rows = []
    for i, (a, b) in enumerate(steps):
        inside = [(n, s, e) for n, s, e in spans if s >= a and e <= b]
        gen = sum(e - s for n, s, e in inside if n.startswith(GENERATION_SPANS))
        prep = [(s, e) for n, s, e in inside if n == "_prepare_inputs"]
        prep_s = sum(e - s for s, e in prep)
        passes = sum(e - s for n, s, e in inside if n == "_get_per_token_logps_and_entropies"
                     and any(ps <= s and e <= pe for ps, pe in prep))  # fmt: skip
        replay = sum(e - s for n, s, e in inside if n == "replay")
        rows.append({"total": b - a, "generation": gen, "rollout+reference": passes, "replay": replay,
                     "training": (b - a) - prep_s, "other": max(0.0, prep_s - gen - passes - replay),
                     "completion_mean": float(by_step.get(i + 1, {}).get("completions/mean_length", 0.0))})  # fmt: skip
    for r in rows:  # CPU time over the threads: the wall time of a run that overlaps them perfectly
        for k in ("total", *PHASES):
            r[k] /= threads
    Path(out).write_text(json.dumps(rows))


def measure(
    recipe: str, overrides: list[str], threads: int, steps: int, warmup: int, python: str | None = None
) -> dict[str, Any]:
    """Median step and phases of ``mrtpo train recipe overrides`` (a fresh process), and the spread."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "steps.json"
        args = [
            *overrides,
            "--trl.max_steps",
            str(steps + warmup),
            "--trl.output_dir",
            str(Path(tmp) / "run"),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "VLLM_CPU_KVCACHE_SPACE": "1"}
        cmd = [
            python or sys.executable,
            "-m",
            "mrtpo.plan.steptime",
            "--child",
            recipe,
            str(threads),
            str(out),
            "--",
            *args,
        ]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if p.returncode != 0 or not out.is_file():
            tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
            raise RuntimeError(f"training failed: {' | '.join(tail)}")
        rows = json.loads(out.read_text())[warmup:]
    med = {k: statistics.median(r[k] for r in rows) for k in ("total", *PHASES, "completion_mean")}
    totals = sorted(r["total"] for r in rows)
    shares = {k: statistics.median(r[k] / r["total"] for r in rows) for k in PHASES}
    return {"median": med, "shares": shares, "steps": len(rows), "min": totals[0], "max": totals[-1]}


def predict(
    recipe: str, overrides: list[str], threads: int, response_tokens: int | None = None
) -> dict[str, Any]:
    """``mrtpo plan recipe --device cpu --threads N -- overrides``'s step, by the phases measured."""
    from mrtpo.plan import plan_recipe

    args = SimpleNamespace(gpus=None, nodes=1, gpu="h100", gpu_memory=None, sharding=None, offload="none",
                           mfu=0.4, pass_rate=[str(PASS_RATE)], rollout_tokens=None,
                           response_tokens=response_tokens, prompt_max=None, device="cpu", threads=threads)  # fmt: skip
    args.gpus = 1
    st = plan_recipe(recipe, args, overrides).step
    sec = {k: v["seconds"] for k, v in st.phases.items()}
    out = {"generation": sec.get("generation", 0.0),
           "rollout+reference": sec.get("rollout pass", 0.0) + sec.get("reference", 0.0),
           "replay": sec.get("replay", 0.0), "training": sec.get("training", 0.0), "other": 0.0}  # fmt: skip
    out["total"] = st.seconds
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--child":
        _, recipe, threads, out, _sep, *overrides = argv
        _child(recipe, overrides, int(threads), out)
        return 0
    p = argparse.ArgumentParser(prog="python -m mrtpo.plan.steptime", description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=12, help="steps measured per configuration (after --warmup)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeat", type=int, default=1, help="runs of each configuration (the noise)")
    p.add_argument("--only", action="append", default=None, help="a configuration's name (repeatable)")
    p.add_argument("--json", default=None, help="also write the figures to this file")
    p.add_argument("--cached-profile", action="store_true",
                   help="reuse the cached CPU profile (by default it is measured again first, under the load the "
                   "runs will see: CPU time per operation rises with the load of the other core)")  # fmt: skip
    p.add_argument("--vllm-python", default=None, metavar="PYTHON",
                   help="the interpreter of an environment with vLLM's CPU build (scripts/cpu_vllm_env.sh: "
                   ".venv-vllm/bin/python): also runs the configurations generating with the real vLLM engine")  # fmt: skip
    a = p.parse_args(argv)
    if a.threads < 1 or a.steps < 1 or a.warmup < 0 or a.repeat < 1:
        p.error("--threads, --steps and --repeat must be >= 1, --warmup >= 0")
    known = {**{n: (RECIPE, [*BASE, *o]) for n, o in CONFIGS.items()},
             **{n: (VLLM_RECIPE, o) for n, o in VLLM_CONFIGS.items()}}  # fmt: skip
    names = a.only or [*CONFIGS, *(VLLM_CONFIGS if a.vllm_python else ())]
    unknown = [n for n in names if n not in known]
    if unknown:
        p.error(f"unknown configuration {unknown[0]!r}; known: {', '.join(known)}")
    if any(n in VLLM_CONFIGS for n in names) and not a.vllm_python:
        p.error("the vLLM configurations need --vllm-python PYTHON (an environment with vLLM's CPU build)")
    results = []
    from mrtpo.plan.device import cpu_profile

    # measured once, now (the configurations' plans read it from the cache)
    prof, _path, _fresh = cpu_profile(a.threads, refresh=not a.cached_profile)
    load = os.getloadavg()[0]
    recipes = f"{RECIPE} {' '.join(BASE[:4])}" if any(n in CONFIGS for n in names) else ""
    if any(n in VLLM_CONFIGS for n in names):
        recipes += f"{'; vLLM: ' if recipes else ''}{VLLM_RECIPE} ({a.vllm_python})"
    print(f"mrtpo plan --device cpu vs mrtpo train, {recipes}, {a.threads} thread(s), "
          f"median of {a.steps} steps after {a.warmup}; seconds (share of the step)")  # fmt: skip
    print(f"CPU profile {'measured now' if not a.cached_profile else 'cached'} ({prof.measured_at}); "
          f"load average {load:.2f} before the runs")  # fmt: skip
    head = f"{'configuration':16s} {'':9s} {'step':>6s}  " + "  ".join(f"{k:>17s}" for k in PHASES)
    print(head)
    for name in names:
        recipe, over = known[name]
        t_max = int(over[over.index("--trl.max_completion_length") + 1])
        pred = predict(recipe, over, a.threads, response_tokens=round(RESPONSE_SHARE * t_max))
        python = a.vllm_python if name in VLLM_CONFIGS else None
        for rep in range(a.repeat):
            got = measure(recipe, over, a.threads, a.steps, a.warmup, python=python)
            m, sh = got["median"], got["shares"]
            err = pred["total"] / m["total"] - 1
            worst = max(abs(100 * (pred[k] / pred["total"] - sh[k])) for k in PHASES)
            results.append({"config": name, "run": rep + 1, "predicted": pred, "measured": got,
                            "error": err, "worst_share_points": worst})  # fmt: skip
            label = name if rep == 0 else f"  (run {rep + 1})"
            print(f"{label:16s} {'predicted':9s} {pred['total']:6.3f}  " + "  ".join(
                f"{pred[k]:7.3f} ({100 * pred[k] / pred['total']:3.0f} %)" for k in PHASES))  # fmt: skip
            print(f"{'':16s} {'measured':9s} {m['total']:6.3f}  " + "  ".join(
                f"{m[k]:7.3f} ({100 * sh[k]:3.0f} %)" for k in PHASES))  # fmt: skip
            print(f"{'':16s} {'':9s} step {100 * err:+.0f} % (steps {got['min']:.3f} .. {got['max']:.3f} s); "
                  f"largest share gap {worst:.0f} points; completions {m['completion_mean']:.0f} tokens on average",
                  flush=True)  # fmt: skip
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1) + "\n")
    within = sum(1 for r in results if abs(r["error"]) <= 0.25 and r["worst_share_points"] <= 10)
    print(f"load average {os.getloadavg()[0]:.2f} after the runs")
    print(f"within 25 % and 10 points: {within} of {len(results)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
