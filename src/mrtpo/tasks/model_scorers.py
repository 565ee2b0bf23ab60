"""The scorers behind model rewards: the model, its inputs and its one forward, per ``kind``.

A :class:`Scorer` holds a loaded model and its tokenizer (:func:`mrtpo.tasks.scorer_loading.load_scorer`) and
runs the verdict's log-odds ``d`` without gradient (:meth:`Scorer.log_odds`) or with the gradient to its
input embeddings (:meth:`Scorer.attribute`, P2T's attribution). What differs per kind is small: how the
prompt and the response are rendered into the scorer's text and what ``d`` is of the model's output

- :class:`ClassifierScorer`: the prompt's messages and the response as the assistant's turn of the chat
  template; ``d`` is the one logit, or label ``label`` against the others;
- :class:`JudgeScorer`: the judge prompt (``template``: the rubric, the prompt, the response) as one user
  message; ``d = logsumexp(z_yes) − logsumexp(z_no)`` over the next-token logits, and the probability
  of answering yes or no at all is recorded (:attr:`Scorer.last_answer_mass`).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mrtpo.tasks.base import Example
from mrtpo.tasks.model_reward_spec import ModelRewardSpec

_SENTINEL = "\u2063mrtpo-response\u2063"


def _placeholders(template: str, values: Mapping[str, str]) -> str:
    """``{rubric}``, ``{prompt}``, ``{response}`` replaced in one pass (a value is never rescanned)."""
    return re.sub(r"\{(rubric|prompt|response)\}", lambda m: values[m.group(1)], template)


def forward_kwargs(model: Any, embeds, mask, pos) -> tuple[dict[str, Any], Mapping[str, Any]]:
    """The keywords of one forward from input embeddings (``position_ids`` where the model takes them, no
    cache: one forward, and none under gradient checkpointing) and the model's forward parameters."""
    params = inspect.signature(model.forward).parameters
    kw: dict[str, Any] = {"inputs_embeds": embeds, "attention_mask": mask}
    if "position_ids" in params:
        kw["position_ids"] = pos
    if "use_cache" in params:
        kw["use_cache"] = False
    return kw, params


class Scorer:
    """A model reward's model at work (the module's docstring).

    Args:
        spec: the reward's declared fields.
        rubric: ``example -> the judge's question`` (its information segment, else ``spec.rubric``).
    """

    def __init__(self, spec: ModelRewardSpec, rubric: Callable[[Example], str]):
        self.spec, self.rubric = spec, rubric
        self.model: Any = None
        self.tokenizer: Any = None
        self.checkpointing = False
        self.last_answer_mass: list[float] = []

    # ------------------------------------------------------------------ loading and placement

    def attach(self, model: Any, tokenizer: Any) -> None:
        """Use a model loaded elsewhere (the policy as its own judge), as it is."""
        self.model, self.tokenizer = model, tokenizer

    def device(self):
        import torch

        if self.spec.device != "auto":
            return torch.device(self.spec.device)
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        return torch.device("cpu")

    def load(self) -> tuple[Any, Any]:
        """``(model, tokenizer)``, loaded and checked at the first call (:func:`~mrtpo.tasks.scorer_loading.load_scorer`)."""
        if self.model is not None:
            return self.model, self.tokenizer
        spec = self.spec
        if spec.uses_policy:
            raise ValueError(
                f"{spec.where}: model='policy' has no policy attached (the trainer attaches it; outside a "
                "trainer call attach_policy(model, tokenizer))"
            )
        import torch

        from mrtpo.tasks.scorer_loading import enable_checkpointing, load_scorer

        device = self.device()
        dtype = spec.dtype
        if dtype == "auto":
            dtype = "bfloat16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
        model, tok = load_scorer(
            spec.where,
            spec.model,
            kind=spec.kind,
            tokenizer=spec.tokenizer,
            dtype=getattr(torch, dtype) if isinstance(spec.model, str) else None,
            revision=spec.revision,
            trust_remote_code=spec.trust_remote_code,
        )
        model.requires_grad_(False)  # frozen: attribution differentiates the input embeddings only
        self.checkpointing = spec.gradient_checkpointing and enable_checkpointing(model)
        self.model = model.to("cpu" if spec.rest_on_cpu else device).eval()
        self.tokenizer = tok
        return self.model, self.tokenizer

    def prepare(self) -> None:
        """Load now (every way the model cannot be had is one line)."""
        self.load()

    @contextlib.contextmanager
    def placed(self):
        """The model on its device for the block (``rest_on_cpu``: back on the CPU after it)."""
        model, _ = self.load()
        if not self.spec.rest_on_cpu or self.spec.uses_policy:
            yield model
            return
        model.to(self.device())
        try:
            yield model
        finally:
            model.to("cpu")

    @contextlib.contextmanager
    def eval_mode(self):
        model, _ = self.load()
        was = model.training
        model.eval()  # a policy judge computes without dropout
        try:
            yield model
        finally:
            model.train(was)

    # ------------------------------------------------------------------ inputs

    def render(self, example: Example, messages: list[dict[str, str]], prompt: str, tok: Any) -> str:
        """The scorer's text with :data:`_SENTINEL` where the response goes (per kind)."""
        raise NotImplementedError

    def text_around(self, example: Example) -> tuple[str, str, bool]:
        """(text before the response, text after it, whether a chat template was applied)."""
        _, tok = self.load()
        messages = example.messages()
        prompt = "\n\n".join(m["content"] for m in messages)
        text = self.render(example, messages, prompt, tok)
        before, sep, after = text.partition(_SENTINEL)
        if not sep or _SENTINEL in after:
            raise ValueError(f"{self.spec.where}: the scorer's template does not place the response once")
        return before, after, bool(getattr(tok, "chat_template", None))

    def tokenize(
        self, example: Example, middle: str
    ) -> tuple[list[int], list[tuple[int, int]], int, int, int]:
        """The scorer's tokens of ``before + middle + after`` (:meth:`text_around`): ids and character
        offsets of the last ``max_length`` tokens, where ``middle`` starts and ends in that text, and the
        number of tokens cut from the start. A tokenizer without offsets (a slow one) gets them from
        per-token decoding (:func:`mrtpo.attribution.decoded_offsets`)."""
        _, tok = self.load()
        before, after, templated = self.text_around(example)
        text = before + middle + after
        start, end = len(before), len(before) + len(middle)
        try:
            enc = tok(text, add_special_tokens=not templated, return_offsets_mapping=True)
            offsets = [tuple(int(x) for x in o) for o in enc["offset_mapping"]]
        except (NotImplementedError, ValueError, TypeError, KeyError):  # a slow tokenizer: no offsets
            from mrtpo.attribution import decoded_offsets

            enc = tok(text, add_special_tokens=not templated)
            offsets, start, end = decoded_offsets(tok, [int(i) for i in enc["input_ids"]], text, start, end)
        ids = [int(i) for i in enc["input_ids"]]
        cut = max(0, len(ids) - self.spec.max_length)
        return ids[cut:], offsets[cut:], start, end, cut

    def encode(self, example: Example, response: str) -> tuple[list[int], list[tuple[int, int]], int]:
        """Scorer ids (the last ``max_length``), their spans in the response text (``(-1, -1)`` for tokens
        outside it), and the number of tokens cut from the start (:meth:`tokenize`)."""
        ids, offsets, start, end, cut = self.tokenize(example, response)
        spans = []
        for a, b in offsets:
            lo, hi = max(a, start), min(b, end)
            spans.append((lo - start, hi - start) if hi > lo else (-1, -1))
        return ids, spans, cut

    def batch(self, seqs: Sequence[list[int]]):
        """Left-padded ``input_ids``, ``attention_mask`` and ``position_ids`` (from 0 at each first token)."""
        import torch

        model, tok = self.load()
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

    # ------------------------------------------------------------------ the forward

    def head(self, model: Any, kw: dict[str, Any], params: Mapping[str, Any]):
        """The verdict's log-odds d [B] of one forward (per kind)."""
        raise NotImplementedError

    def log_odds_of(self, embeds, mask, pos):
        """The verdict's log-odds d [B] from input embeddings (the one forward of verdicts and attribution)."""
        model, _ = self.load()
        kw, params = forward_kwargs(model, embeds, mask, pos)
        return self.head(model, kw, params)

    def null(self, emb):
        _, tok = self.load()
        if tok.pad_token_id is None:
            raise ValueError(
                f"{self.spec.where}: the scorer's tokenizer has no pad token (P2T's null token e_null)"
            )
        return emb.weight[int(tok.pad_token_id)].detach()

    def log_odds(self, examples: Sequence[Example], responses: Sequence[str]) -> list[float]:
        """The verdict's log-odds d of each response, in batches of ``batch_size``, without gradient."""
        import torch

        out: list[float] = []
        seqs = [self.encode(ex, r)[0] for ex, r in zip(examples, responses, strict=True)]
        self.last_answer_mass = []
        size = self.spec.batch_size
        with self.placed(), self.eval_mode() as model, torch.no_grad():
            emb = model.get_input_embeddings()
            for i in range(0, len(seqs), size):
                ids, mask, pos = self.batch(seqs[i : i + size])
                out += self.log_odds_of(emb(ids), mask, pos).tolist()
        return out

    def attribute(
        self, examples: Sequence[Example], responses: Sequence[str], *, scalar: str = "logit_diff", stats=None
    ) -> list[Any]:
        """P2T's influence of the scorer's tokens on each response (:meth:`ModelReward.attribute`)."""
        import torch

        from mrtpo.attribution import ResponseInfluence, attribute, verdict_scalar
        from mrtpo.tasks.scorer_loading import checkpointed

        enc = [self.encode(ex, r) for ex, r in zip(examples, responses, strict=True)]
        out = []
        self.last_answer_mass = []
        size = self.spec.attribution_batch_size
        with self.placed(), self.eval_mode() as model, checkpointed(model, self.checkpointing):
            emb = model.get_input_embeddings()
            null = self.null(emb)
            for i in range(0, len(enc), size):
                part = enc[i : i + size]
                ids, mask, pos = self.batch([e[0] for e in part])
                with torch.no_grad():
                    e = emb(ids)
                s, infl = attribute(
                    lambda x, m=mask, p=pos: verdict_scalar(self.log_odds_of(x, m, p), scalar),
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

    def check_answers(self) -> None:
        """Raise ValueError when the last verdicts' answers fail (a judge not answering); nothing by default."""


class ClassifierScorer(Scorer):
    """A sequence-classification reward model: the response as the assistant's turn; d its score."""

    def render(self, example, messages, prompt, tok) -> str:
        if getattr(tok, "chat_template", None):
            return tok.apply_chat_template(
                [*messages, {"role": "assistant", "content": _SENTINEL}], tokenize=False
            )
        return prompt + "\n\n" + _SENTINEL

    def head(self, model, kw, params):
        from mrtpo.attribution import log_odds

        return log_odds(model(**kw).logits, self.spec.label)  # [B, C] -> [B]


class JudgeScorer(Scorer):
    """A causal LM answering the rubric with yes or no: d = logsumexp(z_yes) − logsumexp(z_no)."""

    def __init__(self, spec: ModelRewardSpec, rubric: Callable[[Example], str]):
        super().__init__(spec, rubric)
        self.answer_ids: tuple[list[int], list[int]] | None = None

    def attach(self, model: Any, tokenizer: Any) -> None:
        super().attach(model, tokenizer)
        self.answer_ids = None

    def prepare(self) -> None:
        super().prepare()
        self.answers()

    def render(self, example, messages, prompt, tok) -> str:
        values = {"rubric": self.rubric(example), "prompt": prompt, "response": _SENTINEL}
        content = _placeholders(self.spec.template, values)
        if getattr(tok, "chat_template", None):
            return tok.apply_chat_template(
                [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
            )
        return content + "\n"

    def answers(self) -> tuple[list[int], list[int]]:
        """The first token ids of each answer word's spellings (yes ids, no ids)."""
        if self.answer_ids is None:
            _, tok = self.load()
            unk = getattr(tok, "unk_token_id", None)
            out = []
            for word in self.spec.answers:
                ids: list[int] = []
                for form in (word, word.capitalize(), " " + word, " " + word.capitalize()):
                    enc = tok(form, add_special_tokens=False)["input_ids"]
                    if enc and enc[0] != unk and enc[0] not in ids:
                        ids.append(int(enc[0]))
                if not ids:
                    raise ValueError(f"{self.spec.where}: the judge's tokenizer has no token for {word!r}")
                out.append(ids)
            if set(out[0]) & set(out[1]):
                raise ValueError(f"{self.spec.where}: answers {list(self.spec.answers)} share a first token")
            self.answer_ids = (out[0], out[1])
        return self.answer_ids

    def head(self, model, kw, params):
        import torch

        from mrtpo.attribution import log_odds

        if "logits_to_keep" in params:
            kw["logits_to_keep"] = 1
        z = model(**kw).logits[:, -1, :]  # [B, V]
        yes, no = self.answers()
        with torch.no_grad():  # P(yes or no) over the whole vocabulary: is the judge answering?
            mass = torch.logsumexp(z.float()[:, yes + no], -1) - torch.logsumexp(z.float(), -1)
            self.last_answer_mass += mass.exp().tolist()
        return log_odds(z, yes, no)

    def check_answers(self) -> None:
        """A judge not answering (P(yes or no) below ``min_answer_mass``) is a failed verdict."""
        low = [m for m in self.last_answer_mass if m < self.spec.min_answer_mass]
        if low:
            raise ValueError(
                f"the judge's probability of answering yes or no is {min(low):.3g}, below min_answer_mass="
                f"{self.spec.min_answer_mass:g} (it is not answering the question; check its template and answers)"
            )


SCORERS: dict[str, type[Scorer]] = {"classifier": ClassifierScorer, "judge": JudgeScorer}
"""The scorer of each ``kind``."""
