"""Prompts as tagged segments, and the chat messages of the rollout, full and leave-one-out contexts.

A prompt is a list of :class:`Segment`. Each segment carries text and the names of the rewards whose
verifier checks it. Rollout segments are shown to the policy when it samples; privileged segments
(references) are only added in replay, in a block after the task text and before the assistant turn.

Contexts of one response (docs/design.md §5):

- rollout: every non-privileged segment (what the policy saw when it sampled);
- full ``C``: rollout segments plus every privileged segment;
- leave-one-out ``C_-k``: ``C`` without the segments tagged with reward ``k``;
- joint ``C_-all``: ``C`` without every segment tagged with any reward.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Segment:
    """One piece of a prompt.

    Attributes:
        text: the text; the texts of one message are joined with ``sep`` (see :func:`assemble`).
        rewards: names of the rewards this segment is information for (possibly empty).
        privileged: True for information the policy must not see while sampling (a reference
            answer); it is only added to the full replay context.
        role: chat role of the message the segment goes into: "system" or "user".
    """

    text: str
    rewards: frozenset[str] = field(default_factory=frozenset)
    privileged: bool = False
    role: str = "user"

    def __post_init__(self) -> None:
        if not isinstance(self.rewards, frozenset):
            object.__setattr__(self, "rewards", frozenset(self.rewards))
        if self.role not in ("system", "user"):
            raise ValueError(f"Segment.role must be 'system' or 'user', got {self.role!r}")


def assemble(
    segments: list[Segment],
    *,
    privileged: bool = True,
    drop: frozenset[str] | set[str] = frozenset(),
    sep: str = "\n\n",
) -> list[dict[str, str]]:
    """Chat messages of a prompt: one system message (if any system segment) and one user message.

    Args:
        segments: the prompt.
        privileged: include privileged segments (placed after all rollout user segments).
        drop: reward names whose segments are removed (a segment is removed when it is tagged with
            any of them).
        sep: separator between the texts of consecutive kept segments of one message.

    Returns:
        ``[{"role": "system", "content": ...}?, {"role": "user", "content": ...}]``
    """
    kept = [s for s in segments if not (s.rewards & drop) and (privileged or not s.privileged)]
    system = [s.text for s in kept if s.role == "system" and s.text]
    user = [s.text for s in kept if s.role == "user" and not s.privileged and s.text]
    user += [s.text for s in kept if s.role == "user" and s.privileged and s.text]
    messages = []
    if system:
        messages.append({"role": "system", "content": sep.join(system)})
    messages.append({"role": "user", "content": sep.join(user)})
    return messages


def has_privileged(segments: list[Segment]) -> bool:
    """True when the full replay context differs from the rollout prompt."""
    return any(s.privileged for s in segments)
