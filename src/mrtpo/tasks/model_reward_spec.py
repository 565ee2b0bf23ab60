"""The declared fields of a model reward (:class:`ModelRewardSpec`), checked once when it is built.

Standard library only (a device name is checked with torch when it is not ``auto``): the task option
``model_rewards`` is read and refused in one line before any model loads.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

KINDS = ("classifier", "judge", "prm")
"""The scorer a model reward runs (``kind``): a sequence classifier's score, a judge's yes/no verdict, or a
process reward model's score of each step."""
STEP_AGGREGATES = ("min", "mean", "last")
"""How a process reward model's step log-odds make the response's verdict."""
OUTPUTS = ("prob", "logit")
RUBRIC_SEGMENTS = ("privileged", "prompt", "none")
DTYPES = ("auto", "float32", "bfloat16", "float16")
POLICY = "policy"
"""``model: policy``: the judge is the policy being trained (its current weights)."""

DEFAULT_TEMPLATE = (
    "Read the request and the response, then answer the question about the response with yes or no.\n\n"
    "Request:\n{prompt}\n\nResponse:\n{response}\n\nQuestion: {rubric}\nAnswer yes or no."
)
"""The judge prompt (one user message; ``{rubric}``, ``{prompt}`` and ``{response}`` are filled in)."""


def _is_device(name: str) -> bool:
    import torch

    try:
        torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        return False
    return True


@dataclass
class ModelRewardSpec:
    """What a model reward is, as declared (the fields of a ``model_rewards`` entry; docs/methods.md).

    Attributes:
        name: the reward's column (and the tag of its rubric segment).
        model: a local folder or hub id, a loaded model, or ``"policy"`` (a judge only).
        kind: ``classifier``, ``judge`` or ``prm`` (:data:`KINDS`).
        tokenizer: the scorer's tokenizer (a path or an object; default: the model's).
        rubric: the judge's question (its information when the example has no segment tagged ``name``).
        rubric_segment: where the rubric goes in every example: ``privileged`` (replay only), ``prompt``
            (the policy sees it) or ``none``.
        output: ``prob`` (σ(d) in [0, 1]) or ``logit`` (d clipped to ``bounds``).
        bounds: ``(lo, hi)``; default (0, 1) for ``prob`` (required for ``logit``).
        label: the positive label of a classifier with several labels (default the last).
        answers: the judge's ``(yes, no)`` words; each counts with the first token of its spellings
            ``word``, ``Word``, `` word`` and `` Word``.
        template: the judge prompt, with ``{rubric}``, ``{prompt}`` and ``{response}``.
        device: ``auto`` (this process's GPU, else the CPU) or a torch device of its own (``cuda:1``).
        dtype: ``auto`` (bfloat16 on a GPU that has it, else float32), ``float32``, ``bfloat16``, ``float16``.
        batch_size: sequences per forward of the verdicts (no gradient).
        max_length: scorer tokens kept per sequence (the last ones).
        revision: the hub revision of ``model`` (a branch, tag or commit).
        trust_remote_code: run the Python code shipped with the model (its folder or hub repo) to build it;
            off by default, since that code runs in the training process.
        attribution_batch_size: sequences per gradient-tracked forward of ``p2t``'s attribution (default 1:
            its activations are kept for the backward, :func:`mrtpo.attribution.attribution_activation_bytes`).
        gradient_checkpointing: recompute the scorer's layer activations in the attribution's backward
            instead of keeping them (a model of its own; a ``policy`` judge is left as the trainer set it).
        rest_on_cpu: keep the scorer on the CPU between calls, on ``device`` only while it scores.
        min_answer_mass: a judge's verdict fails when its probability of the yes and no tokens together is
            below this (the judge is not answering the question).
        step_token: ``prm``: the token placed after each step of the response (the text between blank
            lines), where the process reward model scores the step (label ``label`` of its token head).
        step_aggregate: ``prm``: the response's log-odds from its steps': ``min``, ``mean`` or ``last``.

    Raises:
        ValueError: one line ``model reward '<name>': <field>=<value> must be ...``.
    """

    name: str
    model: Any
    kind: str = "classifier"
    tokenizer: Any = None
    rubric: str | None = None
    rubric_segment: str = "privileged"
    output: str = "prob"
    bounds: Sequence[float] | None = None
    label: int = -1
    answers: Sequence[str] = ("yes", "no")
    template: str = DEFAULT_TEMPLATE
    device: str = "auto"
    dtype: str = "auto"
    batch_size: int = 8
    max_length: int = 2048
    revision: str | None = None
    trust_remote_code: bool = False
    attribution_batch_size: int = 1
    gradient_checkpointing: bool = True
    rest_on_cpu: bool = False
    min_answer_mass: float = 1e-3
    step_token: str | None = None
    step_aggregate: str = "min"
    where: str = field(default="", init=False, repr=False)

    def __post_init__(self) -> None:
        name = self.name
        if not isinstance(name, str) or not name:
            raise ValueError(f"model reward name={name!r} must be a non-empty string")
        where = self.where = f"model reward {name!r}"
        for value, choices, label_ in (
            (self.kind, KINDS, "kind"),
            (self.output, OUTPUTS, "output"),
            (self.rubric_segment, RUBRIC_SEGMENTS, "rubric_segment"),
            (self.dtype, DTYPES, "dtype"),
        ):
            if value not in choices:
                raise ValueError(f"{where}: {label_}={value!r} must be one of {', '.join(choices)}")
        model = self.model
        if model is None or (isinstance(model, str) and not model):
            raise ValueError(f"{where}: model is required (a folder, a hub id or 'policy')")
        if isinstance(model, str) and model == POLICY and self.kind != "judge":
            raise ValueError(
                f"{where}: model='policy' is a judge (kind: judge); a classifier needs its own model"
            )
        if self.kind == "prm" and (not isinstance(self.step_token, str) or not self.step_token):
            raise ValueError(
                f"{where}: kind='prm' needs step_token, the token after each step that the model scores at "
                "(e.g. '<extra_0>')"
            )
        if self.step_aggregate not in STEP_AGGREGATES:
            raise ValueError(
                f"{where}: step_aggregate={self.step_aggregate!r} must be one of {', '.join(STEP_AGGREGATES)}"
            )
        if self.kind == "judge":
            if "{response}" not in self.template:
                raise ValueError(f"{where}: template must contain {{response}}")
            ans = self.answers
            if len(ans) != 2 or not all(isinstance(a, str) and a.strip() for a in ans):
                raise ValueError(f"{where}: answers={list(ans)!r} must be two words (yes, no)")
        self.answers = tuple(self.answers)
        for label_, value, lo in (
            ("batch_size", self.batch_size, 1),
            ("max_length", self.max_length, 8),
            ("attribution_batch_size", self.attribution_batch_size, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise ValueError(f"{where}: {label_}={value!r} must be an integer >= {lo}")
        self._check_bounds(where)
        for label_ in ("trust_remote_code", "gradient_checkpointing", "rest_on_cpu"):
            if not isinstance(getattr(self, label_), bool):
                raise ValueError(f"{where}: {label_}={getattr(self, label_)!r} must be true or false")
        rev = self.revision
        if rev is not None and (not isinstance(rev, str) or not rev):
            raise ValueError(f"{where}: revision={rev!r} must be a branch, tag or commit (a string)")
        m = self.min_answer_mass
        if isinstance(m, bool) or not isinstance(m, numbers.Real) or not (0 <= m < 1):
            raise ValueError(f"{where}: min_answer_mass={m!r} must be a number in [0, 1)")
        self.min_answer_mass = float(m)
        dev = self.device
        if not isinstance(dev, str) or not dev or (dev != "auto" and not _is_device(dev)):
            raise ValueError(f"{where}: device={dev!r} must be 'auto' or a torch device such as cuda:1")
        self.label = int(self.label)

    def _check_bounds(self, where: str) -> None:
        bounds = self.bounds
        if self.output == "logit" and bounds is None:
            raise ValueError(f"{where}: output='logit' needs bounds [lo, hi] (the score is clipped to them)")
        b = (0.0, 1.0) if bounds is None else tuple(bounds)
        ok = len(b) == 2 and all(
            isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x) for x in b
        )
        if not ok or b[0] >= b[1]:
            raise ValueError(f"{where}: bounds={bounds!r} must be two finite numbers lo < hi")
        if self.output == "prob" and (b[0] > 0 or b[1] < 1):
            raise ValueError(f"{where}: bounds={list(b)} must contain [0, 1] with output='prob'")
        self.bounds = (float(b[0]), float(b[1]))

    @property
    def uses_policy(self) -> bool:
        """True for a judge that is the policy itself (``model: policy``)."""
        return isinstance(self.model, str) and self.model == POLICY


FIELDS = frozenset(f.name for f in fields(ModelRewardSpec) if f.name != "where")
"""The fields of a ``model_rewards`` entry."""
