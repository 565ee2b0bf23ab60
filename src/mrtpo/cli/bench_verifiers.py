"""``mrtpo bench verifiers``: the time of one verdict on adversarial responses, per verifier.

    mrtpo bench verifiers [--chars 20000] [--family tools sql instruct] [--top 10] [--output FILE]

Each verifier (tools format / correctness / call spans, the SQL static check and parser, every IFEval /
IFBench checker with the kwargs of its first bundled row) is timed once on each adversarial text of
``--chars`` characters: runs of one unit (``[``, newlines, ``". "``, ``<tool_call>``, ``;--\\n``, ...)
that make backtracking regexes or tokenizers slow. The table lists the slowest (verifier, text) pairs
and, per family, the worst strict verdict; for the slowest instruction checkers also the loose verdict
(up to 8 strict checks). ``--chars`` above the instruction checkers' cap (20,000) times the upstream
checkers beyond it (``max_chars`` raised).
"""

from __future__ import annotations

import json
import time

UNITS = [
    "[", "]", "{", "\n", " ", "*", "-", "<<", ". ", "P.S.\n", "Question 1\n", "* x\n", "1. x\n", "a",
    '"', "#", "<tool_call>", "</tool_call>\n", "<think>", '{"a": ', ";--\n", "/*", "'", "```sql\n", "9",
]  # fmt: skip


def add_arguments(parser) -> None:
    parser.add_argument("--chars", type=int, default=20_000, help="length of each adversarial text")
    parser.add_argument(
        "--family", nargs="+", default=["tools", "sql", "instruct"], choices=["tools", "sql", "instruct"]
    )
    parser.add_argument("--top", type=int, default=10, help="rows of the slowest pairs to print")
    parser.add_argument("--output", default=None, help="JSON file for every measurement")


def _texts(chars: int) -> dict[str, str]:
    return {repr(u): (u * (chars // len(u) + 1))[:chars] for u in UNITS}


def _time(fn, *args, **kwargs) -> float:
    t0 = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - t0


def _tools(texts: dict[str, str]) -> list[tuple[str, str, float]]:
    from mrtpo.tasks.tools import correctness_reward, format_reward
    from mrtpo.tasks.tools.parse import call_spans

    ref = '<think> a </think>\n<tool_call>\n{"name": "f", "parameters": {"x": 1}}\n</tool_call>'
    out = []
    for name, text in texts.items():
        out.append(("tools:format", name, _time(format_reward, text, ref)))
        out.append(("tools:format strict_json", name, _time(format_reward, text, ref, strict_json=True)))
        out.append(("tools:correctness", name, _time(correctness_reward, text, ref)))
        out.append(("tools:call_spans", name, _time(call_spans, text)))
    return out


def _sql(texts: dict[str, str]) -> list[tuple[str, str, float]]:
    from mrtpo.tasks.sql.sandbox import check_query
    from mrtpo.tasks.sql.verify import parse_response

    out = []
    for name, text in texts.items():
        out.append(("sql:check_query", name, _time(check_query, "SELECT 1" + text)))
        out.append(("sql:parse_response", name, _time(parse_response, text)))
    return out


def _instruct_cases() -> dict[str, tuple[dict, str]]:
    from mrtpo.tasks.instruct.data import load_benchmark

    cases: dict[str, tuple[dict, str]] = {}
    for name in ("ifeval", "ifbench"):
        rows, _ = load_benchmark(name)
        for r in rows:
            for iid, kw in zip(r["instruction_id_list"], r["kwargs"]):
                cases.setdefault(iid, (kw, r["prompt"]))
    return cases


def _instruct(texts: dict[str, str], chars: int, top: int) -> list[tuple[str, str, float]]:
    import logging

    from mrtpo.tasks.instruct import checkers

    logging.getLogger("mrtpo.tasks.instruct").setLevel(logging.ERROR)
    max_chars = max(chars, checkers.MAX_CHECKED_CHARS)
    out = []
    for iid, (kw, prompt) in sorted(_instruct_cases().items()):
        checker = checkers.build_checker(iid, kw, prompt)
        for name, text in texts.items():
            try:
                t = _time(checkers.follows_verdict, checker, text, max_chars=max_chars)
            except checkers.MissingNltkData:
                continue
            out.append((f"instruct:{iid}", name, t))
    slow = sorted(out, key=lambda r: -r[2])[:top]
    for label, name, _ in slow:
        iid = label.split(":", 1)[1]
        kw, prompt = _instruct_cases()[iid]
        checker = checkers.build_checker(iid, kw, prompt)
        t = _time(checkers.follows_verdict, checker, texts[name], loose=True, max_chars=max_chars)
        out.append((f"instruct:{iid} (loose)", name, t))
    return out


def run(args) -> int:
    texts = _texts(args.chars)
    rows: list[tuple[str, str, float]] = []
    if "tools" in args.family:
        rows += _tools(texts)
    if "sql" in args.family:
        rows += _sql(texts)
    if "instruct" in args.family:
        rows += _instruct(texts, args.chars, args.top)
    print(f"one verdict on adversarial texts of {args.chars} characters ({len(texts)} texts)")
    print(f"{'verifier':58s} {'text (unit repeated)':24s} {'seconds':>8s}")
    for label, name, t in sorted(rows, key=lambda r: -r[2])[: args.top]:
        print(f"{label:58s} {name:24s} {t:8.4f}")
    print("worst per family:")
    for fam in args.family:
        for kind in ("", " (loose)"):
            sel = [r for r in rows if r[0].startswith(fam + ":") and r[0].endswith(" (loose)") == bool(kind)]
            if sel:
                label, name, t = max(sel, key=lambda r: r[2])
                print(f"  {fam + kind:16s} {t:8.4f} s   {label} on {name}")
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            json.dump([{"verifier": a, "text": b, "seconds": c} for a, b, c in rows], f, indent=1)
    return 0
