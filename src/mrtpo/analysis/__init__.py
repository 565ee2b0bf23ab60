"""Seeing the credit (docs/design.md §8): ``mrtpo explain`` and ``mrtpo report``.

- :mod:`mrtpo.analysis.localization`: distance share on checked tokens, token share, ratio, top-k
  share; checked character spans -> token masks (numpy only);
- :mod:`mrtpo.analysis.explain`: per-token credit of one response (a samples.jsonl record or a live
  replay) as a self-contained HTML page, a PNG and JSON;
- :mod:`mrtpo.analysis.runs`: reading run folders (docs/run-format.md), grouping runs into methods;
- :mod:`mrtpo.analysis.curves`: training curves over seeds, steps to a threshold;
- :mod:`mrtpo.analysis.report`: the report of one or more runs (PNG plots, HTML, JSON);
- :mod:`mrtpo.analysis.style`: the palette of every figure, one colour per method and per reward
  (docs/analysis.md).

matplotlib (the ``analysis`` extra) is imported inside the plotting functions only, with the Agg backend.
"""
