"""``mrtpo bench verifiers``: the time of one verdict on adversarial responses, per verifier.

    mrtpo bench verifiers [--chars 20000] [--family tools sql instruct spans muldimif] [--top 10]
                          [--scaling] [--output FILE]

Each verifier (tools format / correctness / call spans, the SQL static check and parser, every IFEval /
IFBench checker with the kwargs of its first bundled row, every instruction span finder, one MulDimIF
constraint per check family) is timed once on each adversarial text of ``--chars`` characters: runs of
one unit (``[``, newlines, ``". "``, ``<tool_call>``, ``;--\\n``, ...) that make backtracking regexes or
tokenizers slow, and a text of distinct short sentences (no cache helps there). Every response is
checked in full (verdicts have no length cap). The table lists the slowest (verifier, text) pairs and,
per family, the worst strict verdict; for the slowest instruction checkers also the loose verdict (up
to 8 strict checks). ``--scaling`` times the slowest pairs again at half the length and prints the
ratio t(N) / t(N/2): about 2 for a linear verifier, about 4 for a quadratic one.
"""

from __future__ import annotations

import json
import time

UNITS = [
    "[", "]", "{", "\n", " ", "*", "-", "<<", ". ", "P.S.\n", "Question 1\n", "* x\n", "1. x\n", "a",
    '"', "#", "<tool_call>", "</tool_call>\n", "<think>", '{"a": ', ";--\n", "/*", "'", "```sql\n", "9",
]  # fmt: skip
FAMILIES = ("tools", "sql", "instruct", "spans", "muldimif")
DISTINCT = "distinct sentences"
WARM_UP = "Warm up. A short text, with [two] parts.\n\n* one\n* two"


def add_arguments(parser) -> None:
    parser.add_argument("--chars", type=int, default=20_000, help="length of each adversarial text")
    parser.add_argument("--family", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--top", type=int, default=10, help="rows of the slowest pairs to print")
    parser.add_argument(
        "--scaling",
        action="store_true",
        help="time the slowest pairs again at --chars / 2 and print t(N) / t(N/2) (2: linear, 4: quadratic)",
    )
    parser.add_argument("--output", default=None, help="JSON file for every measurement")


def _distinct_sentences(chars: int) -> str:
    """Short sentences that never repeat ("w0. w1. w2. ..."): no cache of repeated pieces helps."""
    out, n, i = [], 0, 0
    while n < chars:
        piece = f"w{i}. "
        out.append(piece)
        n += len(piece)
        i += 1
    return "".join(out)[:chars]


def _texts(chars: int) -> dict[str, str]:
    texts = {repr(u): (u * (chars // len(u) + 1))[:chars] for u in UNITS}
    texts[DISTINCT] = _distinct_sentences(chars)
    return texts


def _time(fn, *args, **kwargs) -> float:
    """Seconds of one cold call (the instruction checkers' tokenizer caches emptied first)."""
    from mrtpo.tasks.instruct import nltk_fallback

    nltk_fallback.clear_caches()
    t0 = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - t0


def _tools_fns() -> dict[str, tuple]:
    from mrtpo.tasks.tools import correctness_reward, format_reward
    from mrtpo.tasks.tools.parse import call_spans

    ref = '<think> a </think>\n<tool_call>\n{"name": "f", "parameters": {"x": 1}}\n</tool_call>'
    return {
        "tools:format": (lambda t: format_reward(t, ref), {}),
        "tools:format strict_json": (lambda t: format_reward(t, ref, strict_json=True), {}),
        "tools:correctness": (lambda t: correctness_reward(t, ref), {}),
        "tools:call_spans": (call_spans, {}),
    }


def _sql_fns() -> dict[str, tuple]:
    from mrtpo.tasks.sql.sandbox import check_query
    from mrtpo.tasks.sql.verify import parse_response

    return {
        "sql:check_query": (lambda t: check_query("SELECT 1" + t), {}),
        "sql:parse_response": (parse_response, {}),
    }


def _instruct_cases() -> dict[str, tuple[dict, str]]:
    from mrtpo.tasks.instruct.data import load_benchmark

    cases: dict[str, tuple[dict, str]] = {}
    for name in ("ifeval", "ifbench"):
        rows, _ = load_benchmark(name)
        for r in rows:
            for iid, kw in zip(r["instruction_id_list"], r["kwargs"]):
                cases.setdefault(iid, (kw, r["prompt"]))
    return cases


def _instruct_fns() -> dict[str, tuple]:
    import logging

    from mrtpo.tasks.instruct import checkers

    logging.getLogger("mrtpo.tasks.instruct").setLevel(logging.ERROR)
    fns = {}
    for iid, (kw, prompt) in sorted(_instruct_cases().items()):
        checker = checkers.build_checker(iid, kw, prompt)
        fns[f"instruct:{iid}"] = (lambda t, c=checker: checkers.follows_verdict(c, t), {})
        fns[f"instruct:{iid} (loose)"] = (lambda t, c=checker: checkers.follows_verdict(c, t, loose=True), {})
    return fns


def _span_fns() -> dict[str, tuple]:
    from mrtpo.tasks.instruct import spans

    cases = _instruct_cases()
    fns = {}
    for iid in sorted(spans.KINDS):
        kw, prompt = cases.get(iid, ({}, ""))
        fns[f"spans:{iid}"] = (lambda t, i=iid, k=kw, p=prompt: spans.checked_spans(i, k, t, p), {})
    return fns


def _muldimif_fns() -> dict[str, tuple]:
    from mrtpo.tasks.instruct import muldimif

    return {
        f"muldimif:{fam}": (lambda t, c=constraint: muldimif.check(c, t), {})
        for fam, constraint in sorted(muldimif.EXAMPLES.items())
    }


def _verifiers(families) -> dict[str, tuple]:
    makers = {
        "tools": _tools_fns,
        "sql": _sql_fns,
        "instruct": _instruct_fns,
        "spans": _span_fns,
        "muldimif": _muldimif_fns,
    }
    out: dict[str, tuple] = {}
    for fam in families:
        out.update(makers[fam]())
    return out


def _measure(fns: dict[str, tuple], texts: dict[str, str], top: int) -> list[tuple[str, str, float]]:
    """Every strict verifier on every text (after one untimed call on a short text); the loose instruction
    verdicts on the ``top`` slowest texts of the strict ones (a loose verdict is up to 8 strict ones)."""
    from mrtpo.tasks.instruct.checkers import MissingNltkData

    rows = []
    for label, (fn, _) in fns.items():
        if label.endswith(" (loose)"):
            continue
        try:  # first calls load data (langdetect profiles, tokenizers, converters): not timed
            for warm in (WARM_UP, WARM_UP.upper(), WARM_UP.lower()):
                fn(warm)
        except MissingNltkData:
            continue
        for name, text in texts.items():
            try:
                rows.append((label, name, _time(fn, text)))
            except MissingNltkData:
                break
    slow = [r for r in sorted(rows, key=lambda r: -r[2]) if r[0].startswith("instruct:")][:top]
    for label, name, _ in slow:
        fn = fns[label + " (loose)"][0]
        rows.append((label + " (loose)", name, _time(fn, texts[name])))
    return rows


def run(args) -> int:
    if args.chars < 2:
        raise ValueError(f"--chars must be >= 2, got {args.chars}")
    fns = _verifiers(args.family)
    texts = _texts(args.chars)
    rows = _measure(fns, texts, args.top)
    print(f"one verdict on adversarial texts of {args.chars} characters ({len(texts)} texts)")
    print(f"{'verifier':62s} {'text (unit repeated)':24s} {'seconds':>8s}")
    slowest = sorted(rows, key=lambda r: -r[2])[: args.top]
    for label, name, t in slowest:
        print(f"{label:62s} {name:24s} {t:8.4f}")
    print("worst per family:")
    for fam in args.family:
        for kind in ("", " (loose)"):
            sel = [r for r in rows if r[0].startswith(fam + ":") and r[0].endswith(" (loose)") == bool(kind)]
            if sel:
                label, name, t = max(sel, key=lambda r: r[2])
                print(f"  {fam + kind:16s} {t:8.4f} s   {label} on {name}")
    scaling = []
    if args.scaling:
        half = _texts(args.chars // 2)
        print(
            f"scaling of the slowest pairs: t({args.chars}) / t({args.chars // 2}) (2: linear, 4: quadratic)"
        )
        for label, name, t in slowest:
            t_half = _time(fns[label][0], half[name])
            scaling.append({"verifier": label, "text": name, "seconds": t, "seconds_half": t_half})
            print(f"  {label:60s} {name:24s} {t:8.4f} / {t_half:8.4f} = {t / max(t_half, 1e-9):5.2f}")
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "chars": args.chars,
                    "rows": [{"verifier": a, "text": b, "seconds": c} for a, b, c in rows],
                    "scaling": scaling,
                },
                f,
                indent=1,
            )
    return 0
