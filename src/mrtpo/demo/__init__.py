"""``mrtpo demo``: GRPO, GDPO and MRTPO on the synthetic multi-constraint task, from scratch, on CPU.

Steps (each with a progress bar):

1. warm start (:mod:`mrtpo.demo.warmstart`): a 2-layer, d = 64 Qwen2 model (~79k parameters) on the
   task's 70-token word-level vocabulary, trained by supervised fine-tuning on imperfect demonstrations
   (each constraint met with probability 0.5);
2. RL (:mod:`mrtpo.demo.runs`): GRPO, GDPO and MRTPO from that warm start, for each seed, through
   ``MRTPOTrainer`` at the same learning rate; each run writes a run folder (docs/run-format.md);
3. evaluation: per-constraint satisfaction of sampled responses (temperature 1) on held-out prompts,
   for the warm start and every trained policy;
4. report (:mod:`mrtpo.analysis`): reward curves, steps to the satisfaction threshold, localization
   tables, and per-token credit of a few responses under GDPO vs MRTPO.

Output folder::

    DIR/index.html            the summary table and links
    DIR/summary.json          timings, satisfaction per method and seed, steps to threshold
    DIR/warmstart/            the warm-start model, tokenizer and warmstart.json (its measurements)
    DIR/runs/<method>-seed<s>/ run folders (run.json, metrics.jsonl, samples.jsonl)
    DIR/report/               report.html, curves.png, replay.png, top_k.png, report.json
    DIR/report/explain/       explain.html, explain.png, explain.json
"""

from __future__ import annotations

from mrtpo.demo.pipeline import DemoConfig, quick_config, run_demo
from mrtpo.demo.summary import format_table

__all__ = ["DemoConfig", "format_table", "quick_config", "run_demo"]
