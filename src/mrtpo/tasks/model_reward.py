"""Rewards given by a model: a reward model's score or a judge's yes/no verdict on a rubric, next to a task's rules.

A :class:`ModelReward` is a :class:`~mrtpo.tasks.base.Verifier` backed by

- ``kind: classifier``: a Hugging Face sequence-classification reward model (``AutoModelForSequenceClassification``)
  reading the prompt and the response through its tokenizer's chat template; the verdict's log-odds ``d``
  is its one logit, or label ``label`` against the others;
- ``kind: judge``: a causal LM answering a rubric with yes or no (another model, or the policy itself:
  ``model: policy``); ``d = logsumexp(z_yes) − logsumexp(z_no)`` over its next-token logits after the
  judge prompt (``template``: the rubric, the prompt and the response).

The reward is ``σ(d)`` in [0, 1] (``output: prob``, the default: P(yes | yes or no) for a judge), or ``d``
clipped to ``bounds`` (``output: logit``). Responses are scored in batches of ``batch_size`` on
``device`` (``auto``: this process's GPU, else the CPU), without gradient, the scorer frozen; a scorer
input longer than ``max_length`` tokens loses its beginning (the prompt first), so a verdict takes
bounded time whatever the response. A verdict never raises on model output: a non-finite score gets the
reward's minimum and says why.

The rubric is the reward's information: :class:`WithModelRewards` (the task option ``model_rewards``)
adds it to every example as a segment tagged with the reward's name (privileged by default: shown in
replay only), so MRTPO's replay (``C`` vs ``C_−k``) treats it as it treats a rule's information; a
judge reads its rubric from those segments (a task may tag its own, per example, as AdvancedIF's
rubrics are) and falls back to ``rubric``.

A model reward is differentiable: :meth:`ModelReward.attribute` gives P2T's influence of each of its
scorer tokens on the response (:mod:`mrtpo.attribution`), which the credit scheme ``p2t`` turns into that
reward's token weights (docs/methods.md, "P2T").
"""

from __future__ import annotations

import contextlib
import inspect
import math
import numbers
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from mrtpo.prompt import Segment
from mrtpo.tasks.base import Example, Task, Verdict, Verifier

KINDS = ("classifier", "judge")
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

_SENTINEL = "\u2063mrtpo-response\u2063"
_FIELDS = {
    "name",
    "model",
    "kind",
    "tokenizer",
    "rubric",
    "rubric_segment",
    "output",
    "bounds",
    "label",
    "answers",
    "template",
    "device",
    "dtype",
    "batch_size",
    "max_length",
    "revision",
    "trust_remote_code",
    "attribution_batch_size",
    "gradient_checkpointing",
    "rest_on_cpu",
    "min_answer_mass",
}


def _placeholders(template: str, values: Mapping[str, str]) -> str:
    """``{rubric}``, ``{prompt}``, ``{response}`` replaced in one pass (a value is never rescanned)."""
    return re.sub(r"\{(rubric|prompt|response)\}", lambda m: values[m.group(1)], template)


def _is_device(name: str) -> bool:
    import torch

    try:
        torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        return False
    return True


class ModelReward(Verifier):
    """A reward from a model (see the module's docstring).

    Args:
        name: the reward's column (and the tag of its rubric segment).
        model: a local folder or hub id, a loaded model, or ``"policy"`` (a judge only; the trainer attaches
            the policy with :meth:`attach_policy`).
        kind: ``classifier`` or ``judge``.
        tokenizer: the scorer's tokenizer (a path or an object; default: the model's).
        rubric: the judge's question (its information when the example has no segment tagged ``name``).
        rubric_segment: where :class:`WithModelRewards` puts the rubric: ``privileged`` (replay only),
            ``prompt`` (the policy sees it) or ``none``.
        output: ``prob`` (σ(d) in [0, 1]) or ``logit`` (d clipped to ``bounds``).
        bounds: ``(lo, hi)``; default (0, 1) for ``prob`` (required for ``logit``).
        label: the positive label of a classifier with several labels (default the last).
        answers: the judge's ``(yes, no)`` words; each counts with the first token of its spellings
            ``word``, ``Word``, `` word`` and `` Word``.
        template: the judge prompt, with ``{rubric}``, ``{prompt}`` and ``{response}``.
        device: ``auto`` or a torch device string.
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
    """

    differentiable = True

    def __init__(
        self,
        name: str,
        model: Any,
        *,
        kind: str = "classifier",
        tokenizer: Any = None,
        rubric: str | None = None,
        rubric_segment: str = "privileged",
        output: str = "prob",
        bounds: Sequence[float] | None = None,
        label: int = -1,
        answers: Sequence[str] = ("yes", "no"),
        template: str = DEFAULT_TEMPLATE,
        device: str = "auto",
        dtype: str = "auto",
        batch_size: int = 8,
        max_length: int = 2048,
        revision: str | None = None,
        trust_remote_code: bool = False,
        attribution_batch_size: int = 1,
        gradient_checkpointing: bool = True,
        rest_on_cpu: bool = False,
        min_answer_mass: float = 1e-3,
    ):
        where = f"model reward {name!r}"
        if not isinstance(name, str) or not name:
            raise ValueError(f"model reward name={name!r} must be a non-empty string")
        self.name = name
        for value, choices, label_ in (
            (kind, KINDS, "kind"),
            (output, OUTPUTS, "output"),
            (rubric_segment, RUBRIC_SEGMENTS, "rubric_segment"),
            (dtype, DTYPES, "dtype"),
        ):
            if value not in choices:
                raise ValueError(f"{where}: {label_}={value!r} must be one of {', '.join(choices)}")
        if model is None or (isinstance(model, str) and not model):
            raise ValueError(f"{where}: model is required (a folder, a hub id or 'policy')")
        if isinstance(model, str) and model == POLICY and kind != "judge":
            raise ValueError(
                f"{where}: model='policy' is a judge (kind: judge); a classifier needs its own model"
            )
        if kind == "judge":
            if "{response}" not in template:
                raise ValueError(f"{where}: template must contain {{response}}")
            if len(answers) != 2 or not all(isinstance(a, str) and a.strip() for a in answers):
                raise ValueError(f"{where}: answers={list(answers)!r} must be two words (yes, no)")
        for label_, value, lo in (
            ("batch_size", batch_size, 1),
            ("max_length", max_length, 8),
            ("attribution_batch_size", attribution_batch_size, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise ValueError(f"{where}: {label_}={value!r} must be an integer >= {lo}")
        if output == "logit" and bounds is None:
            raise ValueError(f"{where}: output='logit' needs bounds [lo, hi] (the score is clipped to them)")
        b = (0.0, 1.0) if bounds is None else tuple(bounds)
        ok = len(b) == 2 and all(
            isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x) for x in b
        )
        if not ok or b[0] >= b[1]:
            raise ValueError(f"{where}: bounds={bounds!r} must be two finite numbers lo < hi")
        if output == "prob" and (b[0] > 0 or b[1] < 1):
            raise ValueError(f"{where}: bounds={list(b)} must contain [0, 1] with output='prob'")
        for label_, value in (
            ("trust_remote_code", trust_remote_code),
            ("gradient_checkpointing", gradient_checkpointing),
            ("rest_on_cpu", rest_on_cpu),
        ):
            if not isinstance(value, bool):
                raise ValueError(f"{where}: {label_}={value!r} must be true or false")
        if revision is not None and (not isinstance(revision, str) or not revision):
            raise ValueError(f"{where}: revision={revision!r} must be a branch, tag or commit (a string)")
        m = min_answer_mass
        if isinstance(m, bool) or not isinstance(m, numbers.Real) or not (0 <= m < 1):
            raise ValueError(f"{where}: min_answer_mass={m!r} must be a number in [0, 1)")
        if not isinstance(device, str) or not device or (device != "auto" and not _is_device(device)):
            raise ValueError(f"{where}: device={device!r} must be 'auto' or a torch device such as cuda:1")
        self.revision, self.trust_remote_code = revision, trust_remote_code
        self.attribution_batch_size, self.gradient_checkpointing = (
            attribution_batch_size,
            gradient_checkpointing,
        )
        self.rest_on_cpu, self.min_answer_mass = rest_on_cpu, float(m)
        self.last_answer_mass: list[float] = []
        self.bounds = (float(b[0]), float(b[1]))
        self.kind, self.output, self.rubric, self.rubric_segment = kind, output, rubric, rubric_segment
        self.label, self.answers, self.template = int(label), tuple(answers), template
        self.device_name, self.dtype_name = device, dtype
        self.batch_size, self.max_length = batch_size, max_length
        self._model_spec, self._tokenizer_spec = model, tokenizer
        self._model: Any = None
        self._tokenizer: Any = None
        self._answer_ids: tuple[list[int], list[int]] | None = None
        self._checkpointing = False

    # ------------------------------------------------------------------ loading

    @property
    def uses_policy(self) -> bool:
        """True for a judge that is the policy itself (``model: policy``)."""
        return isinstance(self._model_spec, str) and self._model_spec == POLICY

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
        self._model, self._tokenizer, self._answer_ids = model, tokenizer, None

    def _device(self):
        import torch

        if self.device_name != "auto":
            return torch.device(self.device_name)
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        return torch.device("cpu")

    def _load(self) -> tuple[Any, Any]:
        if self._model is not None:
            return self._model, self._tokenizer
        if self.uses_policy:
            raise ValueError(
                f"model reward {self.name!r}: model='policy' has no policy attached (the trainer attaches it; "
                "outside a trainer call attach_policy(model, tokenizer))"
            )
        import torch

        from mrtpo.tasks.scorers import enable_checkpointing, load_scorer

        device = self._device()
        dtype = self.dtype_name
        if dtype == "auto":
            dtype = "bfloat16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
        model, tok = load_scorer(
            f"model reward {self.name!r}",
            self._model_spec,
            kind=self.kind,
            tokenizer=self._tokenizer_spec,
            dtype=getattr(torch, dtype) if isinstance(self._model_spec, str) else None,
            revision=self.revision,
            trust_remote_code=self.trust_remote_code,
        )
        model.requires_grad_(False)  # frozen: attribution differentiates the input embeddings only
        self._checkpointing = self.gradient_checkpointing and enable_checkpointing(model)
        self._model = model.to("cpu" if self.rest_on_cpu else device).eval()
        self._tokenizer = tok
        return self._model, self._tokenizer

    def prepare(self, example: Example | None = None) -> None:
        """Load the scorer now, so that every way it cannot be had is one line before training (the trainer
        calls it at its start), and refuse a judge that has no rubric for ``example`` (its question would be
        empty). A ``policy`` judge is attached later, by the trainer."""
        if self.kind == "judge" and example is not None and not self._rubric(example).strip():
            raise ValueError(
                f"model reward {self.name!r}: a judge needs a rubric, its question: set rubric: '...' or tag a "
                f"segment of each example with {self.name!r} (example {example.id!r} has none)"
            )
        if not self.uses_policy:
            self._load()
            if self.kind == "judge":
                self._answers()

    @contextlib.contextmanager
    def _placed(self):
        """The scorer on its device for the block (``rest_on_cpu``: back on the CPU after it)."""
        model, _ = self._load()
        if not self.rest_on_cpu or self.uses_policy:
            yield model
            return
        model.to(self._device())
        try:
            yield model
        finally:
            model.to("cpu")

    # ------------------------------------------------------------------ scorer inputs

    def _rubric(self, example: Example) -> str:
        return self.information(example) or self.rubric or ""

    def _render(self, example: Example) -> tuple[str, str, bool]:
        """(text before the response, text after it, whether a chat template was applied)."""
        _, tok = self._load()
        messages = example.messages()
        prompt = "\n\n".join(m["content"] for m in messages)
        templated = bool(getattr(tok, "chat_template", None))
        if self.kind == "judge":
            content = _placeholders(
                self.template, {"rubric": self._rubric(example), "prompt": prompt, "response": _SENTINEL}
            )
            if templated:
                text = tok.apply_chat_template(
                    [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
                )
            else:
                text = content + "\n"
        elif templated:
            text = tok.apply_chat_template(
                [*messages, {"role": "assistant", "content": _SENTINEL}], tokenize=False
            )
        else:
            text = prompt + "\n\n" + _SENTINEL
        before, sep, after = text.partition(_SENTINEL)
        if not sep or _SENTINEL in after:
            raise ValueError(
                f"model reward {self.name!r}: the scorer's template does not place the response once"
            )
        return before, after, templated

    def _encode(self, example: Example, response: str) -> tuple[list[int], list[tuple[int, int]], int]:
        """Scorer ids (the last ``max_length``), their spans in the response text (None for tokens outside
        it: ``(-1, -1)``), and the number of tokens cut from the start."""
        _, tok = self._load()
        before, after, templated = self._render(example)
        text = before + response + after
        start, end = len(before), len(before) + len(response)
        try:
            enc = tok(text, add_special_tokens=not templated, return_offsets_mapping=True)
            offsets = [tuple(int(x) for x in o) for o in enc["offset_mapping"]]
        except (NotImplementedError, ValueError, TypeError, KeyError):  # a slow tokenizer: no offsets
            from mrtpo.attribution import decoded_offsets

            enc = tok(text, add_special_tokens=not templated)
            offsets, start, end = decoded_offsets(tok, [int(i) for i in enc["input_ids"]], text, start, end)
        ids = [int(i) for i in enc["input_ids"]]
        cut = max(0, len(ids) - self.max_length)
        spans = []
        for a, b in offsets[cut:]:
            lo, hi = max(a, start), min(b, end)
            spans.append((lo - start, hi - start) if hi > lo else (-1, -1))
        return ids[cut:], spans, cut

    def _answers(self) -> tuple[list[int], list[int]]:
        if self._answer_ids is None:
            _, tok = self._load()
            unk = getattr(tok, "unk_token_id", None)
            out = []
            for word in self.answers:
                ids = []
                for form in (word, word.capitalize(), " " + word, " " + word.capitalize()):
                    enc = tok(form, add_special_tokens=False)["input_ids"]
                    if enc and enc[0] != unk and enc[0] not in ids:
                        ids.append(int(enc[0]))
                if not ids:
                    raise ValueError(
                        f"model reward {self.name!r}: the judge's tokenizer has no token for {word!r}"
                    )
                out.append(ids)
            if set(out[0]) & set(out[1]):
                raise ValueError(
                    f"model reward {self.name!r}: answers {list(self.answers)} share a first token"
                )
            self._answer_ids = (out[0], out[1])
        return self._answer_ids

    # ------------------------------------------------------------------ forward

    def _batch(self, seqs: Sequence[list[int]]):
        """Left-padded ``input_ids``, ``attention_mask`` and ``position_ids`` (from 0 at each first token)."""
        import torch

        model, tok = self._load()
        pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), int(pad), dtype=torch.long)
        mask = torch.zeros(len(seqs), width, dtype=torch.long)
        for j, s in enumerate(seqs):
            if s:
                ids[j, width - len(s) :] = torch.tensor(s)
                mask[j, width - len(s) :] = 1
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        dev = next(model.parameters()).device
        return ids.to(dev), mask.to(dev), pos.to(dev)

    def _log_odds_of(self, embeds, mask, pos):
        """The verdict's log-odds d [B] from input embeddings (the one forward of verdicts and attribution)."""
        import torch

        from mrtpo.attribution import log_odds

        model, _ = self._load()
        params = inspect.signature(model.forward).parameters
        kw: dict[str, Any] = {"inputs_embeds": embeds, "attention_mask": mask}
        if "position_ids" in params:
            kw["position_ids"] = pos
        if "use_cache" in params:
            kw["use_cache"] = False  # one forward: no cache (and none under gradient checkpointing)
        if self.kind == "judge":
            if "logits_to_keep" in params:
                kw["logits_to_keep"] = 1
            z = model(**kw).logits[:, -1, :]  # [B, V]
            yes, no = self._answers()
            with torch.no_grad():  # P(yes or no) over the whole vocabulary: is the judge answering?
                mass = torch.logsumexp(z.float()[:, yes + no], -1) - torch.logsumexp(z.float(), -1)
                self.last_answer_mass += mass.exp().tolist()
            return log_odds(z, yes, no)
        z = model(**kw).logits  # [B, C]
        return log_odds(z, self.label)

    @contextlib.contextmanager
    def _eval_mode(self):
        model, _ = self._load()
        was = model.training
        model.eval()  # a policy judge computes without dropout
        try:
            yield model
        finally:
            model.train(was)

    def _null(self, emb):
        _, tok = self._load()
        pad = tok.pad_token_id
        if pad is None:
            raise ValueError(
                f"model reward {self.name!r}: the scorer's tokenizer has no pad token (P2T's null token e_null)"
            )
        return emb.weight[int(pad)].detach()

    def log_odds(self, examples: Sequence[Example], responses: Sequence[str]) -> list[float]:
        """The verdict's log-odds d of each response, in batches, without gradient."""
        import torch

        out: list[float] = []
        seqs = [self._encode(ex, r)[0] for ex, r in zip(examples, responses, strict=True)]
        self.last_answer_mass = []
        with self._placed(), self._eval_mode() as model, torch.no_grad():
            emb = model.get_input_embeddings()
            for i in range(0, len(seqs), self.batch_size):
                ids, mask, pos = self._batch(seqs[i : i + self.batch_size])
                out += self._log_odds_of(emb(ids), mask, pos).tolist()
        return out

    # ------------------------------------------------------------------ the verifier

    def _value(self, d: float) -> Verdict:
        if not math.isfinite(d):
            return Verdict(self.bounds[0], f"{self.kind} gave a non-finite score ({d}); the minimum")
        if self.output == "prob":
            p = 1.0 / (1.0 + math.exp(-d)) if d > -700 else 0.0
            what = "P(yes)" if self.kind == "judge" else "sigmoid(score)"
            return Verdict(p, f"{what} = {p:.4f} (log-odds {d:.3f})")
        v = min(max(d, self.bounds[0]), self.bounds[1])
        return Verdict(v, f"score {d:.4f}" + (" (clipped)" if v != d else ""))

    def _check_mass(self) -> None:
        """A judge not answering (P(yes or no) below ``min_answer_mass``) is a failed verdict."""
        low = [m for m in self.last_answer_mass if m < self.min_answer_mass]
        if self.kind == "judge" and low:
            raise ValueError(
                f"the judge's probability of answering yes or no is {min(low):.3g}, below min_answer_mass="
                f"{self.min_answer_mass:g} (it is not answering the question; check its template and answers)"
            )

    def verdict(self, example: Example, response: str) -> Verdict:
        d = self.log_odds([example], [str(response)])[0]
        self._check_mass()
        return self._value(d)

    def __call__(self, completions: Sequence[str], examples: Sequence[Example]) -> list[float]:
        """Score a batch: ``batch_size`` sequences per forward, on the scorer's device. A judge that does
        not answer one of them raises, so that the verdicts are redone one by one and that one fails
        (:mod:`mrtpo.tasks.faults`)."""
        d = self.log_odds(list(examples), [str(c) for c in completions])
        self._check_mass()
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
        import torch

        from mrtpo.attribution import ResponseInfluence, attribute, verdict_scalar
        from mrtpo.tasks.scorers import checkpointed

        enc = [self._encode(ex, r) for ex, r in zip(examples, responses, strict=True)]
        out = []
        self.last_answer_mass = []
        size = self.attribution_batch_size
        with self._placed(), self._eval_mode() as model, checkpointed(model, self._checkpointing):
            emb = model.get_input_embeddings()
            null = self._null(emb)
            for i in range(0, len(enc), size):
                part = enc[i : i + size]
                ids, mask, pos = self._batch([e[0] for e in part])
                with torch.no_grad():
                    e = emb(ids)
                s, infl = attribute(
                    lambda x, m=mask, p=pos: verdict_scalar(self._log_odds_of(x, m, p), scalar),
                    e,
                    null,
                    stats=stats,
                    tokens=int(mask.sum()),
                )
                width = ids.shape[1]
                for j, (seq, spans, _) in enumerate(part):
                    row = infl[j, width - len(seq) :].cpu()  # the sequence's own positions (left padding)
                    keep = [t for t, sp in enumerate(spans) if sp[0] >= 0]
                    out.append(ResponseInfluence(row[keep].clone(), [spans[t] for t in keep], float(s[j])))
        if stats is not None:
            stats.responses += len(enc)
        return out


def prepare_model_rewards(verifiers: Sequence[Any], example: Example | None = None) -> None:
    """Load and check every model reward among ``verifiers`` now (:meth:`ModelReward.prepare`): a trainer
    calls it at its start with the first training example, so that a missing folder, a hub id that cannot
    be had offline, a model without a trained head or a judge without a rubric is one line before the
    first generation."""
    for v in verifiers:
        if isinstance(v, ModelReward):
            v.prepare(example)


# --------------------------------------------------------------------------------------------------
# The task option model_rewards
# --------------------------------------------------------------------------------------------------


def parse_model_rewards(
    entries: Any, taken: Sequence[str] = (), field: str = "task.options.model_rewards"
) -> list[ModelReward]:
    """``[{name, model, kind, rubric, ...}, ...]`` -> :class:`ModelReward` objects (in order).

    Raises:
        ValueError: one line naming the entry and field (``task.options.model_rewards[1].kind='critic' must
            be one of classifier, judge``), an unknown field, or a name that is already a reward.
    """
    if not isinstance(entries, (list, tuple)) or not entries:
        raise ValueError(f"{field} must be a non-empty list of {{name, model, ...}} entries; got {entries!r}")
    out: list[ModelReward] = []
    names = set(taken)
    for i, entry in enumerate(entries):
        where = f"{field}[{i}]"
        if not isinstance(entry, Mapping):
            raise ValueError(f"{where} must be a mapping {{name, model, ...}}; got {entry!r}")
        unknown = sorted(set(entry) - _FIELDS)
        if unknown:
            raise ValueError(
                f"{where}: unknown field {', '.join(map(repr, unknown))}; fields: {', '.join(sorted(_FIELDS))}"
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
        if all(isinstance(r, ModelReward) for r in model_rewards):
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
