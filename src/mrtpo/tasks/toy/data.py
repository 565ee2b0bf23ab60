"""Vocabulary, prompts and imperfect demonstrations of the synthetic multi-constraint task.

A prompt lists a few constraints on a short response made of content words, one constraint per
segment, each segment tagged with its constraint type (the reward column that checks it):

====================  ====================  ================================================
constraint type       prompt text           met when (content = response words minus tags)
====================  ====================  ================================================
``start``             ``apple first``       the first content word is ``apple``
``end``               ``river last``        the last content word is ``river``
``include``           ``stone included``    ``stone`` is one of the content words
``length``            ``few words``         at most 4 content words (``many words``: at least 6)
``wrap``              ``<b> wrapped``       the response begins with ``<b>`` and ends with ``</b>``
====================  ====================  ================================================

``start``, ``end``, ``include`` and ``wrap`` are *localizable*: their verdict is decided by specific
tokens (the first or last word, the tags, the included word). ``length`` is the deliberately
*non-local* constraint: no token decides it, only where the response stops (the paper's Table 4
reports such constraints apart). It asks for a range rather than an exact count so that the 2-layer
demo model can meet it: a model with rotary positions and 2 layers does not learn to count (asked
for exactly 3–7 words it met the count 0.25 of the time greedily after the warm start, and 0.27–0.36
under every RL method), but it can learn when to stop early or late from the prompt word. An exact
count (an ``int`` value, ``5 words``) is still a valid constraint for examples built by hand
(:func:`make_example`); generated examples use the ranges.

The value comes before its keyword: the 2-layer warm-start model then learns to copy the right word
sooner (the keyword token, which attention finds by its own identity, picks up the value one position
back). Measured on clean demonstrations, 256 per step, learning rate 1e-2 with cosine decay over 700
steps: after 700 steps the model put 0.57 of its probability on the start word at the first response
position with value-then-keyword prompts, 0.13 with keyword-then-value prompts (``start apple``).

A response looks like ``<b> apple cloud stone river </b>``. Words are whitespace separated, so a
word-level tokenizer maps each word to one token (see :func:`build_toy_tokenizer`).

Example constraint values are kept in ``Example.meta["constraints"]``: ``{"start": "apple",
"length": "few", ...}`` (only the types the prompt lists). The start, end and include words of one prompt
are distinct, so a response of at least 3 words can meet every constraint.
"""

from __future__ import annotations

import random
from typing import Any

from mrtpo.prompt import Segment
from mrtpo.tasks.base import Example

CONSTRAINT_TYPES: tuple[str, ...] = ("start", "end", "include", "length", "wrap")
"""The reward columns of the task, in order (K = 5)."""

LOCAL_TYPES: tuple[str, ...] = ("start", "end", "include", "wrap")
"""The constraint types whose verdict sits on specific tokens of the response."""

NONLOCAL_TYPES: tuple[str, ...] = ("length",)
"""The deliberately non-local constraint type (no token decides it), reported apart."""

KEYWORDS: dict[str, str] = {
    "start": "first",
    "end": "last",
    "include": "included",
    "length": "words",
    "wrap": "wrapped",
}
"""The prompt word that names each constraint type (it follows the value)."""

CONTENT_WORDS: tuple[str, ...] = tuple(
    [
        "apple",
        "river",
        "stone",
        "cloud",
        "tiger",
        "lemon",
        "piano",
        "rocket",
        "garden",
        "candle",
        "forest",
        "mirror",
        "pepper",
        "silver",
        "window",
        "dragon",
        "button",
        "jacket",
        "honey",
        "island",
        "kettle",
        "ladder",
        "marble",
        "needle",
        "orange",
        "pillow",
        "rabbit",
        "saddle",
        "tomato",
        "violin",
        "wagon",
        "yellow",
        "zebra",
        "anchor",
        "basket",
        "cactus",
        "dolphin",
        "engine",
        "feather",
        "guitar",
        "hammer",
        "igloo",
        "jungle",
        "kitten",
        "lantern",
        "meadow",
    ]
)
"""46 content words a response is made of."""

LENGTHS: tuple[int, ...] = (3, 4, 5, 6, 7)
"""Response lengths (content words) of demonstrations, and the exact counts a hand-built ``length``
constraint may ask for."""

LENGTH_RANGES: dict[str, tuple[int, int]] = {"few": (0, 4), "many": (6, 1_000_000)}
"""Generated ``length`` constraints: the value names an inclusive range of content-word counts."""


def length_range(value: Any) -> tuple[int, int]:
    """The inclusive range of content-word counts a ``length`` value asks for.

    >>> length_range("few"), length_range(5)
    ((0, 4), (5, 5))
    """
    if isinstance(value, str) and value in LENGTH_RANGES:
        return LENGTH_RANGES[value]
    if isinstance(value, int) and not isinstance(value, bool) and value in LENGTHS:
        return (value, value)
    raise ValueError(f"length value must be one of {sorted(LENGTH_RANGES)} or {list(LENGTHS)}, got {value!r}")


TAGS: tuple[tuple[str, str], ...] = (("<b>", "</b>"), ("<i>", "</i>"), ("<q>", "</q>"))
"""(open, close) tag pairs a ``wrap`` constraint names by its open tag."""

OPEN_TAGS = frozenset(o for o, _ in TAGS)
CLOSE_OF = dict(TAGS)
TAG_TOKENS = frozenset(t for pair in TAGS for t in pair)


def toy_words() -> list[str]:
    """Every word of the task (constraint keywords, numbers, length ranges, tags, content words): 64
    words, so the tokenizer has 72 tokens with the 8 special tokens of :mod:`mrtpo.models.tiny`."""
    return [
        *(KEYWORDS[k] for k in CONSTRAINT_TYPES),
        *(str(n) for n in LENGTHS),
        *LENGTH_RANGES,
        *(t for pair in TAGS for t in pair),
        *CONTENT_WORDS,
    ]


def build_toy_tokenizer():
    """The word-level tokenizer of the task (72 tokens; see :func:`mrtpo.models.tiny.build_tokenizer`)."""
    from mrtpo.models.tiny import build_tokenizer

    return build_tokenizer(toy_words())


def constraint_text(kind: str, value: Any) -> str:
    """The prompt text of one constraint: the value, then the keyword of its type.

    >>> constraint_text("length", "few"), constraint_text("start", "apple")
    ('few words', 'apple first')
    """
    if kind not in CONSTRAINT_TYPES:
        raise ValueError(f"constraint type must be one of {CONSTRAINT_TYPES}, got {kind!r}")
    return f"{value} {KEYWORDS[kind]}"


def make_example(constraints: dict[str, Any], id: str, order: list[str] | None = None) -> Example:
    """An :class:`Example` listing ``constraints`` (type -> value) in ``order`` (default: dict order).

    Raises:
        ValueError: an unknown type, a value outside the task's vocabulary, or start/end/include words
            that are not distinct.
    """
    order = list(constraints) if order is None else list(order)
    if sorted(order) != sorted(constraints):
        raise ValueError(f"order {order} must list the constraint types {sorted(constraints)} once each")
    for kind, value in constraints.items():
        if kind not in CONSTRAINT_TYPES:
            raise ValueError(f"example {id}: constraint type must be one of {CONSTRAINT_TYPES}, got {kind!r}")
        ok = {
            "start": value in CONTENT_WORDS,
            "end": value in CONTENT_WORDS,
            "include": value in CONTENT_WORDS,
            "length": _is_length(value),
            "wrap": value in OPEN_TAGS,
        }[kind]
        if not ok:
            raise ValueError(
                f"example {id}: constraint {kind!r} has value {value!r} outside the task vocabulary"
            )
    words = [constraints[k] for k in ("start", "end", "include") if k in constraints]
    if len(set(words)) != len(words):
        raise ValueError(f"example {id}: start/end/include words must be distinct, got {words}")
    segments = [Segment(constraint_text(k, constraints[k]), rewards=frozenset({k})) for k in order]
    return Example(id=id, segments=segments, meta={"constraints": dict(constraints)})


def _is_length(value: Any) -> bool:
    try:
        length_range(value)
    except ValueError:
        return False
    return True


def sample_constraints(rng: random.Random, n: int) -> tuple[dict[str, Any], list[str]]:
    """``n`` distinct constraint types drawn uniformly, their values, and a random prompt order."""
    if not 1 <= n <= len(CONSTRAINT_TYPES):
        raise ValueError(f"number of constraints must be in [1, {len(CONSTRAINT_TYPES)}], got {n}")
    kinds = rng.sample(CONSTRAINT_TYPES, n)
    words = rng.sample(CONTENT_WORDS, 3)  # distinct start / end / include words
    value = {
        "start": words[0],
        "end": words[1],
        "include": words[2],
        "length": rng.choice(tuple(LENGTH_RANGES)),
        "wrap": rng.choice(TAGS)[0],
    }
    constraints = {k: value[k] for k in CONSTRAINT_TYPES if k in kinds}  # canonical key order
    return constraints, kinds


def generate_examples(
    n: int, *, seed: int = 0, min_constraints: int = 3, max_constraints: int = 5, prefix: str = "toy"
) -> list[Example]:
    """``n`` examples whose number of constraints is uniform in ``[min_constraints, max_constraints]``.

    The same arguments give the same examples (``random.Random(seed)``).
    """
    if not 1 <= min_constraints <= max_constraints <= len(CONSTRAINT_TYPES):
        raise ValueError(
            f"need 1 <= min_constraints <= max_constraints <= {len(CONSTRAINT_TYPES)}, "
            f"got min_constraints={min_constraints}, max_constraints={max_constraints}"
        )
    rng = random.Random(seed)
    out = []
    for i in range(n):
        constraints, order = sample_constraints(rng, rng.randint(min_constraints, max_constraints))
        out.append(make_example(constraints, f"{prefix}-{seed}-{i}", order))
    return out


def demonstrate(example: Example, rng: random.Random, p_meet: float = 0.5) -> str:
    """An imperfect demonstration: each listed constraint is met with probability ``p_meet``.

    Unlisted constraints are left free: the length is drawn from :data:`LENGTHS` and the response is
    not wrapped. A missed constraint is violated on purpose (another start/end word, the include word
    left out, another length, no tags or other tags). Filler words avoid the prompt's start, end and
    include words, so the verdict of each constraint is exactly the coin flip that decided it.
    """
    if not 0.0 <= p_meet <= 1.0:
        raise ValueError(f"p_meet must be in [0, 1], got {p_meet}")
    c = example.meta["constraints"]
    meet = {k: rng.random() < p_meet for k in c}
    if "length" in c:
        lo, hi = length_range(c["length"])
        n = rng.choice([m for m in LENGTHS if (lo <= m <= hi) == meet["length"]])
    else:
        n = rng.choice(LENGTHS)
    reserved = {c[k] for k in ("start", "end", "include") if k in c}
    pool = [w for w in CONTENT_WORDS if w not in reserved]
    words = [rng.choice(pool) for _ in range(n)]
    if "start" in c and meet["start"]:
        words[0] = c["start"]
    if "end" in c and meet["end"]:
        words[-1] = c["end"]
    if "include" in c and meet["include"]:
        free = [
            i for i in range(n) if not (i == 0 and meet.get("start")) and not (i == n - 1 and meet.get("end"))
        ]
        words[rng.choice(free)] = c["include"]
    if "wrap" in c:
        if meet["wrap"]:
            words = [c["wrap"], *words, CLOSE_OF[c["wrap"]]]
        elif rng.random() < 0.5:  # wrong tags; otherwise none
            other = rng.choice([t for t in TAGS if t[0] != c["wrap"]])
            words = [other[0], *words, other[1]]
    return " ".join(words)
