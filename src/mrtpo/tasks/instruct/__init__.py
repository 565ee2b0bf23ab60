"""Multi-constraint instruction following (task ``instruct``): one {0, 1} reward per constraint.

- :func:`check` / :func:`check_loose`: IFEval's strict / loose verdict for one instruction, on the
  official IFEval and IFBench checkers (:mod:`.checkers`, NLTK-data fallbacks in :mod:`.nltk_fallback`);
- :class:`InstructTask`, :class:`ConstraintVerifier` (:mod:`.verify`), checked spans (:mod:`.spans`);
- data: HIR-16K / IFEval-format loaders and the IFEval / IFBench evaluation sets (:mod:`.data`), a
  synthetic prompt generator (:mod:`.synth`). IFEval / IFBench scoring: :mod:`mrtpo.eval.ifeval`.
"""

from mrtpo.tasks.instruct.checkers import MissingNltkData, check, check_loose, describe, instruction_ids
from mrtpo.tasks.instruct.data import (
    load_benchmark,
    locate_constraints,
    make_example,
    read_rows,
    rows_to_examples,
)
from mrtpo.tasks.instruct.spans import checked_spans, span_kind
from mrtpo.tasks.instruct.verify import ConstraintVerifier, InstructTask, UnusedSlot

__all__ = [
    "ConstraintVerifier",
    "InstructTask",
    "MissingNltkData",
    "UnusedSlot",
    "check",
    "check_loose",
    "checked_spans",
    "describe",
    "instruction_ids",
    "load_benchmark",
    "locate_constraints",
    "make_example",
    "read_rows",
    "rows_to_examples",
    "span_kind",
]
