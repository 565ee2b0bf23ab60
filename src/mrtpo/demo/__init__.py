"""``mrtpo demo``: GRPO, GDPO, MRTPO and MRTPO's controls on the synthetic multi-constraint task, from
scratch, on CPU, over warm starts and RL seeds, with the spread of the results.

Steps (each with a progress bar):

1. warm starts (:mod:`mrtpo.demo.warmstart`): a 2-layer, d = 64 Qwen2 model (~79k parameters) on the
   task's 72-token word-level vocabulary, trained by supervised fine-tuning: a copy phase on clean
   demonstrations, shared, then per warm start an imperfect phase (each constraint met with
   probability 0.5) with its own data and order (3 warm starts by default);
2. RL (:mod:`mrtpo.demo.runs`): GRPO, GDPO, MRTPO (β = 0.5) and the controls MRTPO with shuffled
   weights and MRTPO with joint replay (plus MRTPO at β = 0, 0.25, 1 with ``--beta-sweep``) from
   every warm start with every RL seed (2 by default), through ``MRTPOTrainer`` with the same
   optimiser settings, in parallel worker processes (one torch thread each); each run writes a run
   folder (docs/run-format.md);
3. evaluation: per-constraint satisfaction of sampled responses (temperature 1) on held-out prompts,
   for every warm start and every trained policy;
4. statistics (:mod:`mrtpo.demo.summary`): steps to threshold and held-out satisfaction per method,
   warm start and seed, medians, and every method's difference from GDPO with a two-level bootstrap
   interval (warm starts, then seeds within each), overall and per constraint type (``length``, the
   non-local constraint, apart); the claims whose interval excludes 0, and whether the aim is met;
5. report: ``index.html`` leads with those tables and the curves; :mod:`mrtpo.analysis` writes the
   reward curves, localization tables, where each reward's distance falls in the response, and the
   per-token credit of a few responses under GDPO vs MRTPO.

Output folder::

    DIR/index.html            the tables, the intervals, the claims, the curves, links
    DIR/summary.json          every run (method, warm start, seed, steps to threshold, held-out
                              satisfaction); per method: per-run values and medians; comparisons: every
                              method − GDPO; claims; aim; timings, wall_seconds, machine (load average)
    DIR/warmstart/            copy_phase.pt (the shared phase), ws<w>/ (model, tokenizer, warmstart.json)
    DIR/runs/ws<w>/<method>-seed<s>/   run folders (run.json, metrics.jsonl, samples.jsonl)
    DIR/report/               curves_main.png, report.html, curves.png, replay.png, top_k.png,
                              position.png, report.json
    DIR/report/explain/       explain.html, explain.png, explain.json
"""

from __future__ import annotations

from mrtpo.demo.pipeline import DemoConfig, quick_config, run_demo
from mrtpo.demo.summary import format_table

__all__ = ["DemoConfig", "format_table", "quick_config", "run_demo"]
