"""Contexts of one example: the rollout prompt, the full context C, leave-one-out C_-k and joint C_-all.

docs/design.md §4-5. Core module: torch and the standard library only; the tokenizer is duck-typed (a Hugging Face tokenizer with a
chat template).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mrtpo.prompt import Segment, assemble


def tokenize_messages(tokenizer: Any, messages: list[dict[str, str]], **template_kwargs: Any) -> list[int]:
    """Token ids of chat ``messages`` through the tokenizer's chat template, ending with the assistant
    generation prompt (``add_generation_prompt=True`` unless ``template_kwargs`` says otherwise).

    Extra ``template_kwargs`` (``enable_thinking=False``, ``tools=...``) go to ``apply_chat_template``.
    transformers 5 returns a dict from ``apply_chat_template(tokenize=True)`` unless
    ``return_dict=False``; both forms (and a batch of one) are accepted.
    """
    kwargs = {"add_generation_prompt": True, **template_kwargs, "tokenize": True, "return_dict": False}
    ids = tokenizer.apply_chat_template(messages, **kwargs)
    if isinstance(ids, Mapping) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    if torch.is_tensor(ids):
        ids = ids.tolist()
    ids = list(ids)
    if ids and isinstance(ids[0], (list, tuple)):
        if len(ids) != 1:
            raise ValueError(f"apply_chat_template returned a batch of {len(ids)} sequences; expected one")
        ids = list(ids[0])
    return [int(i) for i in ids]


@dataclass(frozen=True)
class Contexts:
    """Token ids of the contexts of one example (one prompt), ready for :func:`make_requests`.

    Attributes:
        reward_names: the K reward names, in column order.
        rollout: the rollout prompt (every non-privileged segment): what the policy saw when sampling.
        full: full context ``C`` (rollout plus privileged segments).
        leave_one_out: ``C_-k`` for each reward k, aligned with ``reward_names`` (``[K]`` sequences).
        joint: ``C_-all``: ``C`` without every segment tagged with any reward.
    """

    reward_names: tuple[str, ...]
    rollout: tuple[int, ...]
    full: tuple[int, ...]
    leave_one_out: tuple[tuple[int, ...], ...]
    joint: tuple[int, ...]

    @property
    def full_is_rollout(self) -> bool:
        """True when ``C`` is the rollout prompt, so the rollout pass's hidden states can be reused."""
        return self.full == self.rollout


def build_contexts(
    tokenizer: Any,
    segments: Sequence[Segment],
    reward_names: Sequence[str],
    *,
    sep: str = "\n\n",
    **template_kwargs: Any,
) -> Contexts:
    """Rollout, full, leave-one-out and joint contexts of a prompt (docs/design.md §4-5).

    Messages come from :func:`mrtpo.prompt.assemble` (privileged segments in a block after the task
    text, before the assistant turn) and are tokenized with the tokenizer's chat template.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template (duck-typed).
        segments: the prompt, tagged by reward.
        reward_names: the K reward names (column order of the advantages); a segment tagged with a
            name outside this list is an error.
        sep: separator between the texts of one message (as in :func:`mrtpo.prompt.assemble`).
        template_kwargs: extra keyword arguments of ``apply_chat_template``.
    """
    names = tuple(reward_names)
    if not names:
        raise ValueError("reward_names is empty; expected at least one reward name")
    if len(set(names)) != len(names):
        raise ValueError(f"reward_names has duplicates: {list(names)}")
    for i, seg in enumerate(segments):
        unknown = sorted(seg.rewards - set(names))
        if unknown:
            raise ValueError(
                f"segments[{i}] is tagged with unknown reward(s) {unknown}; known: {list(names)}"
            )

    done: dict[str, tuple[int, ...]] = {}  # variants with the same messages are tokenized once

    def ids(**kw: Any) -> tuple[int, ...]:
        messages = assemble(list(segments), sep=sep, **kw)
        key = repr(messages)
        if key not in done:
            done[key] = tuple(tokenize_messages(tokenizer, messages, **template_kwargs))
        return done[key]

    full = ids(privileged=True)
    return Contexts(
        reward_names=names,
        rollout=ids(privileged=False),
        full=full,
        leave_one_out=tuple(ids(privileged=True, drop=frozenset({k})) for k in names),
        joint=ids(privileged=True, drop=frozenset(names)),
    )


class ContextCache:
    """Contexts per prompt, tokenized once per distinct prompt (a repeated prompt, the G responses of one
    prompt, a later epoch reuse them).

    Args:
        tokenizer: the policy's tokenizer (its chat template).
        reward_names: the K reward names in column order.
        template_kwargs: extra ``apply_chat_template`` arguments (the engine's own).
        max_prompts: the cache is cleared when it holds this many prompts.
    """

    def __init__(
        self,
        tokenizer: Any,
        reward_names: Sequence[str],
        template_kwargs: Mapping[str, Any] | None = None,
        max_prompts: int = 4096,
    ) -> None:
        self.tokenizer, self.reward_names = tokenizer, tuple(reward_names)
        self.template_kwargs = dict(template_kwargs or {})
        self.max_prompts = max_prompts
        self._cache: dict[tuple[Segment, ...], Contexts] = {}

    def __len__(self) -> int:
        return len(self._cache)

    def get(self, segments: Sequence[Segment]) -> Contexts:
        """The contexts of one prompt (its tagged segments)."""
        key = tuple(segments)
        ctx = self._cache.get(key)
        if ctx is None:
            if len(self._cache) >= self.max_prompts:
                self._cache.clear()
            ctx = self._cache[key] = build_contexts(
                self.tokenizer, segments, self.reward_names, **self.template_kwargs
            )
        return ctx

    def __call__(self, prompts: Sequence[Sequence[Segment]]) -> list[Contexts]:
        """``[B]`` contexts of B prompts' segments."""
        return [self.get(p) for p in prompts]
