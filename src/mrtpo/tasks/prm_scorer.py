"""The scorer of ``kind: prm``: a process reward model scoring each step of the response (P2T's setting).

The response's steps are the text between blank lines (P2T's steps, :func:`mrtpo.attribution.step_segments`);
the scorer reads the prompt and the response as a classifier does, with ``step_token`` placed right after
each step, and a token-classification head (``AutoModelForTokenClassification``) gives at each step
token the step's log-odds ``d_s`` (label ``label`` against the others). The response's verdict is
``min``, ``mean`` or the ``last`` of the ``d_s`` (``step_aggregate``); a response with no step (empty, or
its step tokens cut by ``max_length``) has a non-finite score, so the reward's minimum.

Attribution (P2T with a process reward model): each token's influence is on its own step's score,
``I_i = ⟨e_i − e_null, ∂S_s/∂e_i⟩`` for token i of step s (one backward per step, the forward shared), and
:attr:`mrtpo.attribution.ResponseInfluence.step_scores` carries ``σ(d_s)``, with which
:func:`mrtpo.attribution.gradient_attribution` shares the response's credit among its steps
(:func:`mrtpo.attribution.step_factors`) before each step's share is spread over its own tokens.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from mrtpo.tasks.base import Example
from mrtpo.tasks.model_scorers import ClassifierScorer, forward_kwargs

STEP_SEPARATOR = "\n\n"


def steps_of(response: str) -> list[tuple[int, int]]:
    """The character spans of the response's non-empty steps (text between blank lines)."""
    out, pos = [], 0
    for part in response.split(STEP_SEPARATOR):
        if part:
            out.append((pos, pos + len(part)))
        pos += len(part) + len(STEP_SEPARATOR)
    return out


class PRMScorer(ClassifierScorer):
    """A process reward model (the module's docstring)."""

    def step_id(self) -> int:
        _, tok = self.load()
        ids = tok(self.spec.step_token, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise ValueError(
                f"{self.spec.where}: step_token={self.spec.step_token!r} is {len(ids)} tokens of the scorer's "
                "tokenizer; it must be one (add it as a special token)"
            )
        return int(ids[0])

    def prepare(self) -> None:
        super().prepare()
        self.step_id()

    def encode(self, example: Example, response: str) -> tuple[list[int], list[tuple[int, int]], int]:
        """As :meth:`Scorer.encode`, with ``step_token`` after each step; spans in the response's own
        characters (the step tokens have none)."""
        mark = self.spec.step_token
        origin: list[int] = []  # the response character of each character of the marked response (-1: mark)
        pieces, pos = [], 0
        for _, b in steps_of(response):
            pieces.append(response[pos:b] + mark)
            origin += list(range(pos, b)) + [-1] * len(mark)
            pos = b
        pieces.append(response[pos:])
        origin += list(range(pos, len(response)))
        marked = "".join(pieces)
        ids, offsets, start, end, cut = self.tokenize(example, marked)
        spans = []
        for a, b in offsets:
            chars = [origin[c - start] for c in range(max(a, start), min(b, end)) if origin[c - start] >= 0]
            spans.append((min(chars), max(chars) + 1) if chars else (-1, -1))
        return ids, spans, cut

    def _step_log_odds(self, model, embeds, mask, pos, seqs) -> list[Any]:
        """The log-odds ``d_s`` [S_b] at each row's step tokens (one forward)."""
        from mrtpo.attribution import log_odds

        kw, _ = forward_kwargs(model, embeds, mask, pos)
        logits = model(**kw).logits  # [B, W, C]
        step, width, out = self.step_id(), embeds.shape[1], []
        for b, seq in enumerate(seqs):
            at = [width - len(seq) + t for t, i in enumerate(seq) if i == step]
            out.append(log_odds(logits[b, at], self.spec.label) if at else logits.new_zeros(0))
        return out

    def _aggregate(self, d) -> float:
        if d.numel() == 0:
            return float("nan")  # no step scored: the reward's minimum
        how = self.spec.step_aggregate
        return float(d.min() if how == "min" else d.mean() if how == "mean" else d[-1])

    def log_odds(self, examples: Sequence[Example], responses: Sequence[str]) -> list[float]:
        import torch

        seqs = [self.encode(ex, r)[0] for ex, r in zip(examples, responses, strict=True)]
        out: list[float] = []
        size = self.spec.batch_size
        with self.placed(), self.eval_mode() as model, torch.no_grad():
            emb = model.get_input_embeddings()
            for i in range(0, len(seqs), size):
                part = seqs[i : i + size]
                ids, mask, pos = self.batch(part)
                out += [self._aggregate(d) for d in self._step_log_odds(model, emb(ids), mask, pos, part)]
        return out

    def attribute(
        self, examples: Sequence[Example], responses: Sequence[str], *, scalar: str = "logit_diff", stats=None
    ) -> list[Any]:
        """Each token's influence on its own step's score, and the steps' scores (the module's docstring)."""
        import torch

        from mrtpo.attribution import ResponseInfluence, influence, verdict_scalar
        from mrtpo.tasks.scorer_loading import checkpointed

        enc = [self.encode(ex, r) for ex, r in zip(examples, responses, strict=True)]
        steps = [steps_of(r) for r in responses]
        out = []
        size = self.spec.attribution_batch_size
        with self.placed(), self.eval_mode() as model, checkpointed(model, self.checkpointing):
            emb = model.get_input_embeddings()
            null = self.null(emb)
            for i in range(0, len(enc), size):
                t0 = time.perf_counter()
                part = enc[i : i + size]
                ids, mask, pos = self.batch([e[0] for e in part])
                with torch.no_grad():
                    e = emb(ids)
                x = e.detach().clone().requires_grad_(True)
                width, backwards = ids.shape[1], 0
                with torch.enable_grad():
                    ds = self._step_log_odds(model, x, mask, pos, [p[0] for p in part])
                    for j, (seq, spans, _) in enumerate(part):
                        d, bounds = ds[j], steps[i + j]
                        values = torch.zeros(len(seq))
                        for s in range(min(d.numel(), len(bounds))):
                            (g,) = torch.autograd.grad(
                                verdict_scalar(d[s : s + 1], scalar).sum(), x, retain_graph=True
                            )
                            backwards += 1
                            infl = influence(x[j : j + 1], g[j : j + 1], null)[0, width - len(seq) :].cpu()
                            lo, hi = bounds[s]
                            own = [t for t, (a, b) in enumerate(spans) if a >= 0 and a < hi and b > lo]
                            values[own] = infl[own]
                        keep = [t for t, sp in enumerate(spans) if sp[0] >= 0]
                        scores = torch.sigmoid(d.detach().float()).tolist()
                        out.append(
                            ResponseInfluence(
                                values[keep].clone(),
                                [spans[t] for t in keep],
                                self._aggregate(d.detach()),
                                step_scores=scores,
                            )
                        )
                if stats is not None:
                    stats.sequences += len(part)
                    stats.forwards += 1
                    stats.backwards += backwards
                    stats.tokens += int(mask.sum())
                    stats.padded_tokens += int(mask.numel())
                    stats.seconds += time.perf_counter() - t0
        if stats is not None:
            stats.responses += len(enc)
        return out
