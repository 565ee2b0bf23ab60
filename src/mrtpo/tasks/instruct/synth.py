"""Synthetic multi-constraint training prompts from the IFEval checker registry (no HIR-16K needed).

Each prompt is a writing task (a template filled with a topic) followed by n constraints, n drawn
uniformly from ``[min_constraints, max_constraints]`` (5 to 13 as in HIR-16K). The constraints are
IFEval instruction types that do not conflict with each other (IFEval's conflict table, made
symmetric; no type twice), in random order. Each checker draws its own kwargs (keywords, counts,
phrases, language ...) as IFEval's generator does, and its description sentence becomes the
constraint's segment. ``combination:repeat_prompt`` repeats the task sentence.

IFBench types are left out on purpose: IFBench is the held-out evaluation (the paper: "constraints not
seen in training"). The draws use a private seeded generator for the choices and Python's global
``random`` (which the checkers use) under a seed, restoring its previous state afterwards, so a seed
gives the same examples every time.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from mrtpo.tasks.base import Example
from mrtpo.tasks.instruct import checkers
from mrtpo.tasks.instruct.data import make_example

TEMPLATES: tuple[str, ...] = (
    "Write a short story about {topic}.",
    "Write a blog post about {topic}.",
    "Explain {topic} to a curious teenager.",
    "Write a letter to a friend describing {topic}.",
    "Write a product description for something related to {topic}.",
    "Write a speech for a school assembly about {topic}.",
    "Give advice to someone who wants to learn about {topic}.",
    "Write a news report about {topic}.",
    "Write a poem about {topic}.",
    "Compare two different views on {topic}.",
    "Write a travel guide entry inspired by {topic}.",
    "Write a job advertisement connected to {topic}.",
    "Summarize the history of {topic}.",
    "Write a dialogue between two people arguing about {topic}.",
    "Write a review of a fictional book about {topic}.",
    "Describe a day in the life of someone who works with {topic}.",
)

TOPICS: tuple[str, ...] = (
    "city gardens",
    "the first bicycle",
    "learning a new language",
    "a lighthouse keeper",
    "rainy weekends",
    "electric cars",
    "the deep ocean",
    "a small bakery",
    "chess tournaments",
    "mountain villages",
    "public libraries",
    "honeybees",
    "a lost wallet",
    "space telescopes",
    "street food",
    "recycling",
    "a school robotics club",
    "ancient maps",
    "night trains",
    "volunteering at a shelter",
    "coffee farms",
    "a power outage",
    "board games",
    "desert plants",
    "a marathon",
    "homemade bread",
    "bridges",
    "the moon landing",
    "a music festival",
    "winter storms",
    "remote work",
    "old photographs",
)

#: IFEval types the generator does not draw. ``constrained_response`` and ``json_format`` conflict with
#: almost every other type (they fix the whole answer), so they never fit a prompt with 5+ constraints.
EXCLUDED: frozenset[str] = frozenset(
    {"detectable_format:constrained_response", "detectable_format:json_format"}
)

#: IFEval types whose responses a rule can write in one line of space-separated words, from the kwargs
#: alone (:func:`mrtpo.tasks.instruct.warmstart.demonstration`): the laptop run's prompts
#: (``types="laptop"``). Left out: types that need newlines (bullets, nth paragraph), long responses
#: (word / sentence counts, letter and capital-word frequencies), another language, upper case, sections
#: (their "Section" clashes with lower case), and repeat_prompt / two_responses (they conflict with
#: almost every other type).
LAPTOP_TYPES: tuple[str, ...] = (
    "change_case:english_lowercase",
    "detectable_content:number_placeholders",
    "detectable_content:postscript",
    "detectable_format:number_highlighted_sections",
    "detectable_format:title",
    "keywords:existence",
    "keywords:forbidden_words",
    "keywords:frequency",
    "length_constraints:number_paragraphs",
    "punctuation:no_comma",
    "startend:end_checker",
    "startend:quotation",
)


def _pick_ids(rng: random.Random, n: int, pool: list[str], example_id: str, tries: int = 200) -> list[str]:
    """``n`` mutually compatible ids, greedily from a shuffled pool; retried with new shuffles."""
    best: list[str] = []
    for _ in range(tries):
        order = pool[:]
        rng.shuffle(order)
        chosen: list[str] = []
        for iid in order:
            if all(iid not in checkers.conflicts(c) and c not in checkers.conflicts(iid) for c in chosen):
                chosen.append(iid)
                if len(chosen) == n:
                    return chosen
        best = max(best, chosen, key=len)
    raise ValueError(
        f"example {example_id}: found at most {len(best)} compatible IFEval constraint types; asked for {n} "
        "(lower max_constraints)"
    )


def _draw(iid: str, task: str, tries: int = 50) -> tuple[str, dict, str]:
    """``(id, kwargs, sentence)`` of one constraint with kwargs drawn by its checker. A draw is kept
    only when rebuilding the checker from the kwargs it reports gives the same sentence: IFEval's
    ``nth_paragraph_first_word`` may draw paragraph n+1 of n (unsatisfiable) and then reports kwargs
    that rebuild differently."""
    given = {"prompt_to_repeat": task} if iid == "combination:repeat_prompt" else {}
    for _ in range(tries):
        checker, sentence = checkers.build_with_description(iid, given, seeded=False)
        kwargs = {**dict(checker.get_instruction_args() or {}), **given}
        if iid == "length_constraints:nth_paragraph_first_word" and not (
            1 <= kwargs["nth_paragraph"] <= kwargs["num_paragraphs"]
        ):
            continue
        if checkers.describe(iid, kwargs, task) == sentence:
            return iid, kwargs, sentence
    raise RuntimeError(f"{iid}: no self-consistent kwargs in {tries} draws")


def generate(
    n: int,
    *,
    min_constraints: int = 5,
    max_constraints: int = 13,
    seed: int = 0,
    slots: int | None = None,
    types: Sequence[str] | None = None,
) -> list[Example]:
    """``n`` synthetic examples (ids ``synthetic-0`` ...).

    Args:
        min_constraints, max_constraints: range of the number of constraints per prompt.
        slots: K, the reward slots of the task (default ``max_constraints``).
        types: the instruction ids to draw from (default: every IFEval id but :data:`EXCLUDED`), or
            "laptop" for :data:`LAPTOP_TYPES`.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not 1 <= min_constraints <= max_constraints:
        raise ValueError(
            f"need 1 <= min_constraints ({min_constraints}) <= max_constraints ({max_constraints})"
        )
    slots = max_constraints if slots is None else slots
    if slots < max_constraints:
        raise ValueError(f"slots={slots} < max_constraints={max_constraints}")
    if types is None:
        pool = [i for i in checkers.instruction_ids("ifeval") if i not in EXCLUDED]
    else:
        types = LAPTOP_TYPES if types == "laptop" else types
        if isinstance(types, str):
            raise ValueError(f"types must be a list of IFEval instruction ids or 'laptop', got {types!r}")
        known = set(checkers.instruction_ids("ifeval"))
        bad = [t for t in types if t not in known or t in EXCLUDED]
        if bad or not types:
            raise ValueError(f"types must be IFEval instruction ids the generator draws, got {list(types)!r}")
        pool = sorted(set(types))
    rng = random.Random(seed)
    saved = random.getstate()
    random.seed(seed)
    try:
        out = []
        for j in range(n):
            task = rng.choice(TEMPLATES).format(topic=rng.choice(TOPICS))
            k = rng.randint(min_constraints, max_constraints)
            constraints = []
            for iid in _pick_ids(rng, k, pool, f"synthetic-{j}"):
                constraints.append(_draw(iid, task))
            out.append(
                make_example(f"synthetic-{j}", task, constraints, max_constraints=slots, source="synthetic")
            )
        return out
    finally:
        random.setstate(saved)
