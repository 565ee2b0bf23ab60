"""``mrtpo demo``: GRPO, GDPO, MRTPO and MRTPO's controls on the synthetic multi-constraint task, from
scratch, on CPU, over seeds, with the spread of the results.

Steps (each with a progress bar):

1. warm start (:mod:`mrtpo.demo.warmstart`): a 2-layer, d = 64 Qwen2 model (~79k parameters) on the
   task's 72-token word-level vocabulary, trained by supervised fine-tuning on imperfect demonstrations
   (each constraint met with probability 0.5);
2. RL (:mod:`mrtpo.demo.runs`): GRPO, GDPO, MRTPO (β = 0.5) and the controls MRTPO with shuffled
   weights and MRTPO with joint replay (plus MRTPO at β = 0, 0.25, 1 with ``--beta-sweep``) from that
   warm start, for each seed, through ``MRTPOTrainer`` with the same optimiser settings, in parallel
   worker processes (one torch thread each); each run writes a run folder (docs/run-format.md);
3. evaluation: per-constraint satisfaction of sampled responses (temperature 1) on held-out prompts,
   for the warm start and every trained policy;
4. statistics (:mod:`mrtpo.demo.summary`): steps to threshold and held-out satisfaction per method
   and seed, medians, and the paired bootstrap interval of MRTPO − GDPO, overall and per constraint
   type (``length``, the non-local constraint, apart);
5. report: ``index.html`` leads with that table and the curves; :mod:`mrtpo.analysis` writes the
   reward curves, localization tables and per-token credit of a few responses under GDPO vs MRTPO.

Output folder::

    DIR/index.html            the table, the MRTPO − GDPO intervals, the curves, links
    DIR/summary.json          per method: per-seed steps to threshold and held-out satisfaction,
                              medians; comparison: MRTPO − GDPO intervals; timings, wall_seconds
    DIR/warmstart/            the warm-start model, tokenizer and warmstart.json (its measurements)
    DIR/runs/<method>-seed<s>/ run folders (run.json, metrics.jsonl, samples.jsonl)
    DIR/report/               curves_main.png, report.html, curves.png, replay.png, top_k.png, report.json
    DIR/report/explain/       explain.html, explain.png, explain.json
"""

from __future__ import annotations

from mrtpo.demo.pipeline import DemoConfig, quick_config, run_demo
from mrtpo.demo.summary import format_table

__all__ = ["DemoConfig", "format_table", "quick_config", "run_demo"]
