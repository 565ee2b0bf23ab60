"""Rewards given by a model: a reward model's score or a judge's yes/no verdict on a rubric, next to a task's rules.

A :class:`ModelReward` is a :class:`~mrtpo.tasks.base.Verifier` made of its declared fields
(:class:`~mrtpo.tasks.model_reward_spec.ModelRewardSpec`, checked when it is built) and a small scorer
per ``kind`` (:mod:`mrtpo.tasks.model_scorers`):

- ``kind: classifier``: a Hugging Face sequence-classification reward model (``AutoModelForSequenceClassification``)
  reading the prompt and the response through its tokenizer's chat template; the verdict's log-odds ``d``
  is its one logit, or label ``label`` against the others;
- ``kind: judge``: a causal LM answering a rubric with yes or no (another model, or the policy itself:
  ``model: policy``); ``d = logsumexp(z_yes) − logsumexp(z_no)`` over its next-token logits after the
  judge prompt (``template``: the rubric, the prompt and the response).

This ``kind: judge`` is one of the two judge rewards: a local model read by its logits in one forward
pass, differentiable, so P2T attributes its verdict to the response's tokens. The other,
:class:`mrtpo.tasks.judged.JudgeVerifier`, asks a judge (an HTTP endpoint or a local folder) for a text
answer and parses a score from it: no gradient, any answer format. Extend this one for a local judge
whose verdict should credit tokens by gradient; that one for an endpoint or a free-form answer.

The reward is ``σ(d)`` in [0, 1] (``output: prob``, the default: P(yes | yes or no) for a judge), or ``d``
clipped to ``bounds`` (``output: logit``). Responses are scored in batches of ``batch_size`` on
``device`` (``auto``: this process's GPU, else the CPU), without gradient, the scorer frozen; a scorer
input longer than ``max_length`` tokens loses its beginning (the prompt first), so a verdict takes
bounded time whatever the response. A verdict never raises on model output: a non-finite score gets the
reward's minimum and says why; a judge that is not answering (its probability of yes or no below
``min_answer_mass``) fails the verdict, for the run's policy on failing verifiers.

The model is loaded and checked when the trainer starts (:func:`prepare_model_rewards`,
:func:`mrtpo.tasks.scorer_loading.load_scorer`): a missing folder, a hub id that cannot be had offline, a head
transformers initialised at random or a judge without a rubric is one line before the first generation.

The rubric is the reward's information: :class:`WithModelRewards` (the task option ``model_rewards``)
adds it to every example as a segment tagged with the reward's name (privileged by default: shown in
replay only), so MRTPO's replay (``C`` vs ``C_−k``) treats it as it treats a rule's information; a
judge reads its rubric from those segments (a task may tag its own, per example, as AdvancedIF's
rubrics are) and falls back to ``rubric``.

A model reward is differentiable: :meth:`ModelReward.attribute` gives P2T's influence of each of its
scorer tokens on the response (:mod:`mrtpo.attribution`), which the credit scheme ``p2t`` turns into that
reward's token weights (docs/methods.md, "p2t").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from mrtpo.prompt import Segment
from mrtpo.tasks.base import Example, Task, Verdict, Verifier
from mrtpo.tasks.model_reward_spec import (
    DEFAULT_TEMPLATE,
    DTYPES,
    FIELDS,
    KINDS,
    OUTPUTS,
    POLICY,
    RUBRIC_SEGMENTS,
    ModelRewardSpec,
)
from mrtpo.tasks.model_scorers import SCORERS, Scorer

__all__ = [
    "DEFAULT_TEMPLATE",
    "DTYPES",
    "KINDS",
    "OUTPUTS",
    "POLICY",
    "RUBRIC_SEGMENTS",
    "ModelReward",
    "ModelRewardSpec",
    "WithModelRewards",
    "answer_mass_metrics",
    "answer_mass_parts",
    "judge_columns",
    "parse_model_rewards",
    "prepare_model_rewards",
    "with_model_rewards",
]

_SPEC_FIELDS = FIELDS - {"name", "model", "tokenizer"}


def _scorer_class(kind: str) -> type[Scorer]:
    if kind == "prm":
        from mrtpo.tasks.prm_scorer import PRMScorer

        return PRMScorer
    return SCORERS[kind]


class ModelReward(Verifier):
    """A reward from a model (see the module's docstring).

    Args:
        name: the reward's column (and the tag of its rubric segment).
        model: a local folder or hub id, a loaded model, or ``"policy"`` (a judge only; the trainer attaches
            the policy with :meth:`attach_policy`).
        **fields: the other fields of :class:`~mrtpo.tasks.model_reward_spec.ModelRewardSpec` (``kind``,
            ``rubric``, ``output``, ``device``, ``attribution_batch_size``, ...), readable as attributes.
    """

    differentiable = True

    def __init__(self, name: str, model: Any, **fields: Any):
        self.spec = ModelRewardSpec(name, model, **fields)
        self.name = name
        self.bounds = tuple(self.spec.bounds)
        self.scorer: Scorer = _scorer_class(self.spec.kind)(self.spec, self._rubric)
        # a judge's P(yes or no) since take_answer_mass: sum, count, min
        self._answer_mass = (0.0, 0, math.inf)

    def __getattr__(self, name: str) -> Any:  # the declared fields, read-only (kind, rubric, device, ...)
        if name in _SPEC_FIELDS and "spec" in self.__dict__:
            return getattr(self.spec, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def uses_policy(self) -> bool:
        """True for a judge that is the policy itself (``model: policy``)."""
        return self.spec.uses_policy

    @property
    def last_answer_mass(self) -> list[float]:
        """A judge's probability of answering yes or no, per response of its last call."""
        return self.scorer.last_answer_mass

    def attach_policy(self, model: Any, tokenizer: Any) -> None:
        """Make the policy (``model``, ``tokenizer``) the judge of a ``model: policy`` reward (no-op otherwise).

        Raises:
            ValueError: the policy's parameters are sharded (FSDP2's DTensors, ZeRO-3's partitions): a
                forward of one process alone would hang its collectives.
        """
        if not self.uses_policy:
            return
        if any(type(p).__name__ == "DTensor" or hasattr(p, "ds_id") for p in model.parameters()):
            raise ValueError(
                f"model reward {self.name!r}: model='policy' is not supported with sharded parameters (FSDP2, "
                "DeepSpeed ZeRO-3); give the judge its own model"
            )
        self.scorer.attach(model, tokenizer)

    def prepare(self, example: Example | None = None) -> None:
        """Load the scorer now, so that every way it cannot be had is one line before training (the trainer
        calls it at its start), and refuse a judge that has no rubric for ``example`` (its question would be
        empty). A ``policy`` judge is attached later, by the trainer."""
        if self.spec.kind == "judge" and example is not None and not self._rubric(example).strip():
            raise ValueError(
                f"model reward {self.name!r}: a judge needs a rubric, its question: set rubric: '...' or tag a "
                f"segment of each example with {self.name!r} (example {example.id!r} has none)"
            )
        if not self.uses_policy:
            self.scorer.prepare()

    def _rubric(self, example: Example) -> str:
        return self.information(example) or self.spec.rubric or ""

    def _load(self) -> tuple[Any, Any]:
        return self.scorer.load()

    @property
    def _model(self) -> Any:
        return self.scorer.model

    def _encode(self, example: Example, response: str) -> tuple[list[int], list[tuple[int, int]], int]:
        return self.scorer.encode(example, response)

    # ------------------------------------------------------------------ the verifier

    def log_odds(self, examples: Sequence[Example], responses: Sequence[str]) -> list[float]:
        """The verdict's log-odds d of each response, in batches, without gradient."""
        d = self.scorer.log_odds(examples, responses)
        masses = self.scorer.last_answer_mass
        if masses:  # a judge
            total, count, low = self._answer_mass
            self._answer_mass = (total + sum(masses), count + len(masses), min(low, *masses))
        return d

    def take_answer_mass(self) -> tuple[float, int, float]:
        """A judge's probability of answering yes or no over its verdicts since the last call: ``(sum, count,
        min)`` (``min`` is ``inf`` without verdicts); kept as running totals (no memory grows), then reset."""
        out, self._answer_mass = self._answer_mass, (0.0, 0, math.inf)
        return out

    def _value(self, d: float) -> Verdict:
        kind = self.spec.kind
        if not math.isfinite(d):
            return Verdict(self.bounds[0], f"{kind} gave a non-finite score ({d}); the minimum")
        if self.spec.output == "prob":
            p = 1.0 / (1.0 + math.exp(-d)) if d > -700 else 0.0
            what = "P(yes)" if kind == "judge" else "sigmoid(score)"
            return Verdict(p, f"{what} = {p:.4f} (log-odds {d:.3f})")
        v = min(max(d, self.bounds[0]), self.bounds[1])
        return Verdict(v, f"score {d:.4f}" + (" (clipped)" if v != d else ""))

    def verdict(self, example: Example, response: str) -> Verdict:
        d = self.log_odds([example], [str(response)])[0]
        self.scorer.check_answers()
        return self._value(d)

    def __call__(self, completions: Sequence[str], examples: Sequence[Example]) -> list[float]:
        """Score a batch: ``batch_size`` sequences per forward, on the scorer's device. A judge that does
        not answer one of them raises, so that the verdicts are redone one by one and that one fails
        (:mod:`mrtpo.tasks.faults`)."""
        before = self._answer_mass
        d = self.log_odds(list(examples), [str(c) for c in completions])
        try:
            self.scorer.check_answers()
        except ValueError:
            self._answer_mass = before  # the rows are redone one by one, each counting its own
            raise
        return [float(self._value(x).value) for x in d]

    # ------------------------------------------------------------------ P2T attribution

    def attribute(
        self,
        examples: Sequence[Example],
        responses: Sequence[str],
        *,
        scalar: str = "logit_diff",
        stats: Any = None,
    ) -> list[Any]:
        """P2T's influence of the scorer's tokens on each response (:func:`mrtpo.attribution.attribute`).

        One gradient-tracked forward and one backward per ``attribution_batch_size`` sequences, to the input
        embeddings only (the scorer's parameters get no gradient), its layers checkpointed
        (``gradient_checkpointing``). A response that no scorer token covers gets no values (the caller
        falls back to replay credit for it). ``scalar``: ``logit_diff`` (d), ``prob`` (σ(d)) or ``logprob``.

        Returns:
            ``[B]`` :class:`mrtpo.attribution.ResponseInfluence`: the influence of the scorer tokens
            overlapping each response and their character spans in it.
        """
        return self.scorer.attribute(examples, responses, scalar=scalar, stats=stats)


def prepare_model_rewards(verifiers: Sequence[Any], example: Example | None = None) -> None:
    """Load and check every model reward among ``verifiers`` now (:meth:`ModelReward.prepare`): a trainer
    calls it at its start with the first training example, so that a missing folder, a hub id that cannot
    be had offline, a model without a trained head or a judge without a rubric is one line before the
    first generation."""
    for v in verifiers:
        if isinstance(v, ModelReward):
            v.prepare(example)


def answer_mass_parts(verifiers: Sequence[Sequence[Any]], columns: Sequence[int]) -> list[list[float]]:
    """Per judge column of ``columns``: ``[sum, count, min]`` of its judges' probability of answering yes or
    no over the verdicts since the last call (:meth:`ModelReward.take_answer_mass`; ``min`` is ``inf`` when
    there were none); summed over processes (``min`` its minimum), :func:`answer_mass_metrics` logs them."""
    out = []
    for col in columns:
        part = [0.0, 0.0, math.inf]
        for r in {id(vs[col]): vs[col] for vs in verifiers}.values():
            if isinstance(r, ModelReward):
                total, count, low = r.take_answer_mass()
                part = [part[0] + total, part[1] + count, min(part[2], low)]
        out.append(part)
    return out


def answer_mass_metrics(parts: Sequence[Sequence[float]], names: Sequence[str]) -> dict[str, float]:
    """``judge/<name>/answer_mass`` (the mean) and ``judge/<name>/answer_mass_min`` of each judge column with
    verdicts, from :func:`answer_mass_parts` combined over processes."""
    out: dict[str, float] = {}
    for (total, count, low), name in zip(parts, names, strict=True):
        if count:
            out[f"judge/{name}/answer_mass"] = total / count
            out[f"judge/{name}/answer_mass_min"] = low
    return out


def judge_columns(verifiers: Sequence[Any]) -> list[int]:
    """The columns of ``verifiers`` (one example's) that are ``kind: judge`` model rewards."""
    return [c for c, v in enumerate(verifiers) if isinstance(v, ModelReward) and v.spec.kind == "judge"]


# --------------------------------------------------------------------------------------------------
# The task option model_rewards
# --------------------------------------------------------------------------------------------------


def parse_model_rewards(
    entries: Any, taken: Sequence[str] = (), field: str = "task.options.model_rewards"
) -> list[Verifier]:
    """``[{name, model, kind, rubric, ...}, ...]`` -> :class:`ModelReward` objects (in order); an entry with
    ``url`` instead of ``model`` is a reward server (:class:`mrtpo.tasks.remote_reward.RemoteReward`).

    Raises:
        ValueError: one line naming the entry and field (``task.options.model_rewards[1].kind='critic' must
            be one of classifier, judge``), an unknown field, or a name that is already a reward.
    """
    if not isinstance(entries, (list, tuple)) or not entries:
        raise ValueError(f"{field} must be a non-empty list of {{name, model, ...}} entries; got {entries!r}")
    from mrtpo.tasks.remote_reward import parse_remote_reward

    out: list[Verifier] = []
    names = set(taken)
    for i, entry in enumerate(entries):
        where = f"{field}[{i}]"
        if not isinstance(entry, Mapping):
            raise ValueError(f"{where} must be a mapping {{name, model, ...}}; got {entry!r}")
        if "url" in entry and "model" not in entry:
            if not isinstance(entry.get("name"), str) or not entry.get("name"):
                raise ValueError(f"{where}.name is required (a string)")
            if entry["name"] in names:
                raise ValueError(f"{where}.name={entry['name']!r} is already a reward of the task")
            names.add(entry["name"])
            out.append(parse_remote_reward(entry, where))
            continue
        unknown = sorted(set(entry) - FIELDS)
        if unknown:
            raise ValueError(
                f"{where}: unknown field {', '.join(map(repr, unknown))}; fields: {', '.join(sorted(FIELDS))}"
            )
        for req in ("name", "model"):
            if not isinstance(entry.get(req), str) or not entry.get(req):
                raise ValueError(f"{where}.{req} is required (a string)")
        if entry["name"] in names:
            raise ValueError(f"{where}.name={entry['name']!r} is already a reward of the task")
        names.add(entry["name"])
        kwargs = {k: v for k, v in entry.items() if k not in ("name", "model")}
        if "answers" in kwargs and isinstance(kwargs["answers"], list):
            kwargs["answers"] = tuple(kwargs["answers"])
        try:
            out.append(ModelReward(entry["name"], entry["model"], **kwargs))
        except ValueError as e:
            msg = str(e).replace(f"model reward {entry['name']!r}: ", "")
            raise ValueError(f"{where}: {msg}") from None
        except TypeError as e:
            raise ValueError(f"{where}: {e}") from None
    return out


class WithModelRewards(Task):
    """A task with model rewards after its own rewards (columns ``task.reward_names + [model rewards]``).

    ``verifiers(example)`` are the task's and then the model rewards (one object each, shared by every
    example, so the trainer scores a batch in one call). ``load`` adds each model reward's rubric to every
    example as a segment tagged with its name (``rubric_segment``: privileged or in the prompt), unless the
    example already has a segment with that tag. ``metrics`` are the task's, on its own columns.

    Args:
        task: the wrapped task.
        model_rewards: :class:`ModelReward` objects, or the entries of :func:`parse_model_rewards`.
    """

    def __init__(self, task: Task, model_rewards: Sequence[Any]):
        self.task = task
        self.name = getattr(task, "name", type(task).__name__)
        from mrtpo.tasks.remote_reward import RemoteReward

        if all(isinstance(r, (ModelReward, RemoteReward)) for r in model_rewards):
            rewards = list(model_rewards)
            clash = sorted(set(task.reward_names) & {r.name for r in rewards})
            if clash:
                raise ValueError(f"model reward {clash[0]!r} is already a reward of task {self.name!r}")
        else:
            rewards = parse_model_rewards(model_rewards, task.reward_names)
        self.model_rewards = rewards
        self.reward_names = [*task.reward_names, *(r.name for r in rewards)]

    def verifiers(self, example: Example) -> list[Verifier]:
        return [*self.task.verifiers(example), *self.model_rewards]

    def with_rubrics(self, example: Example) -> Example:
        """``example`` with the rubric segment of each model reward that has one and lacks a tagged segment."""
        segments = list(example.segments)
        for r in self.model_rewards:
            if not r.rubric or r.rubric_segment == "none" or any(r.name in s.rewards for s in segments):
                continue
            segments.append(Segment(r.rubric, rewards={r.name}, privileged=r.rubric_segment == "privileged"))
        return Example(example.id, segments, dict(example.meta))

    def load(
        self, source: str | None = None, *, split: str = "train", limit: int | None = None
    ) -> list[Example]:
        return [self.with_rubrics(ex) for ex in self.task.load(source, split=split, limit=limit)]

    def metrics(self, examples: Sequence[Example], responses: Sequence[str], rewards) -> dict[str, float]:
        k = len(self.task.reward_names)
        return self.task.metrics(examples, responses, rewards[:, :k])

    def attach_policy(self, model: Any, tokenizer: Any) -> None:
        """Attach the policy to every ``model: policy`` judge."""
        for r in self.model_rewards:
            r.attach_policy(model, tokenizer)

    def __getattr__(self, name: str) -> Any:  # score, close, ... of the wrapped task
        if name == "task":
            raise AttributeError(name)
        return getattr(self.task, name)


def with_model_rewards(task: Task, entries: Any) -> Task:
    """``task`` wrapped in :class:`WithModelRewards` when ``entries`` is not empty, else ``task``."""
    return WithModelRewards(task, entries) if entries else task
