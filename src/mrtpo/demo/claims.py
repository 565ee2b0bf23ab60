"""What the demo claims, corrected for multiplicity.

The demo compares every method with GDPO on 7 rows (all constraints, the localizable ones, each of the
five types) in two parts (steps to the threshold, held-out satisfaction): about 14 tests per method,
about 60 for the default five methods. At 95% each, several intervals exclude 0 by chance alone. So:

- **Primary claims** (:data:`PRIMARY`, named before any run of the design): MRTPO − GDPO in steps to
  the threshold on all constraints and on the localizable constraints, MRTPO − GDPO in held-out
  satisfaction on the same two rows, and the shuffled control (MRTPO with shuffled weights − GDPO in
  steps on the localizable constraints). They form one family, tested with Holm's correction at
  :data:`ALPHA`.
- **Exploratory**: every other (method, part, row) difference, one family of its own with Holm's
  correction; an exploratory finding is stated when it survives, and an uncorrected interval that
  excludes 0 without surviving is listed as a lead, not a claim.

The p-values are the two-level bootstrap's (:func:`mrtpo.analysis.stats.bootstrap_p_value`): two-sided,
from the same resamples as the intervals. Nothing is claimed from fewer than
:data:`mrtpo.demo.summary.MIN_WARM_STARTS` warm starts.

Standard library only.
"""

from __future__ import annotations

from typing import Any

from mrtpo.analysis.stats import holm

PRIMARY: tuple[tuple[str, str, str], ...] = (
    ("mrtpo", "steps", "overall"),
    ("mrtpo", "steps", "localizable"),
    ("mrtpo", "heldout", "overall"),
    ("mrtpo", "heldout", "localizable"),
    ("shuffled", "steps", "localizable"),
)
"""The pre-named primary comparisons ``(method, part, row)``, each against GDPO."""

ALPHA = 0.05
"""Familywise error rate of each family."""

PARTS = ("steps", "heldout")


def _row_name(row: str) -> str:
    from mrtpo.demo.summary import ROW_NAMES

    return ROW_NAMES.get(row, f"the {row} constraint")


def _sentence(summary: dict[str, Any], m: str, part: str, row: str, b: dict[str, Any]) -> str:
    from mrtpo.demo.summary import BASELINE

    table = summary["methods"]
    label = table[m]["label"]
    base = table[BASELINE]["label"] if BASELINE in table else BASELINE.upper()
    thr = summary["threshold"]
    if part == "steps":
        r = summary["comparisons"][m]["steps_ratio"][row]
        verb = "sooner" if b["estimate"] < 0 else "later"
        return (
            f"{label} reaches {thr} on {_row_name(row)} {verb} than {base}: {b['estimate']:+.1f} steps "
            f"[{b['low']:+.1f}, {b['high']:+.1f}] (ratio of median steps {r['estimate']:.2f} [{r['low']:.2f}, "
            f"{r['high']:.2f}])"
        )
    verb = "higher" if b["estimate"] > 0 else "lower"
    return (
        f"{label} ends {verb} than {base} in held-out satisfaction on {_row_name(row)}: "
        f"{b['estimate']:+.3f} [{b['low']:+.3f}, {b['high']:+.3f}]"
    )


def _neutral(summary: dict[str, Any], m: str, part: str, row: str, b: dict[str, Any]) -> str:
    from mrtpo.demo.summary import BASELINE

    table = summary["methods"]
    base = table[BASELINE]["label"] if BASELINE in table else BASELINE.upper()
    what = f"steps to {summary['threshold']}" if part == "steps" else "held-out satisfaction"
    fmt = "+.1f" if part == "steps" else "+.3f"
    return (
        f"{table[m]['label']} − {base}, {what} on {_row_name(row)}: {b['estimate']:{fmt}} "
        f"[{b['low']:{fmt}}, {b['high']:{fmt}}]"
    )


def claims(summary: dict[str, Any], *, alpha: float = ALPHA) -> list[dict[str, Any]]:
    """The tested differences from GDPO, with their family, p-values and whether each holds.

    Returns every primary comparison that was run (holding or not) and every exploratory one whose
    uncorrected interval excludes 0, in the order of the comparisons, rows and parts::

        {"method", "label", "part" ("steps" | "heldout"), "row", "family" ("primary" | "exploratory"),
         "estimate", "low", "high", "p_value", "p_holm", "tests" (size of the family), "holds"
         (p_holm < alpha), "text"}

    ``text`` is a sentence with the direction when the entry holds or is an exploratory lead, and a
    neutral one for a primary comparison that does not hold. Empty with fewer than
    :data:`~mrtpo.demo.summary.MIN_WARM_STARTS` warm starts, or for comparisons without p-values
    (summaries of earlier versions).
    """
    from mrtpo.demo.summary import METRICS, MIN_WARM_STARTS

    cmps = summary.get("comparisons") or {}
    tests: dict[str, list[tuple[str, str, str, dict[str, Any]]]] = {"primary": [], "exploratory": []}
    for m, c in cmps.items():
        if len(c["warm_starts"]) < MIN_WARM_STARTS:
            continue
        for row, _, _ in METRICS:
            for part in PARTS:
                b = c[part].get(row)
                if b is None or b.get("p_value") is None:
                    continue
                fam = "primary" if (m, part, row) in PRIMARY else "exploratory"
                tests[fam].append((m, part, row, b))
    adjusted = {fam: holm([b["p_value"] for *_, b in ts]) for fam, ts in tests.items()}
    out = []
    for fam, ts in tests.items():
        for (m, part, row, b), p_adj in zip(ts, adjusted[fam]):
            holds = p_adj < alpha
            if fam == "exploratory" and b["within_noise"] and not holds:
                continue
            c = cmps[m]
            n_w, n = len(c["warm_starts"]), len(c["units"])
            text = (
                _sentence(summary, m, part, row, b)
                if (holds or fam == "exploratory")
                else _neutral(summary, m, part, row, b)
            )
            text += (
                f" (p = {b['p_value']:.4f}, Holm-adjusted p = {p_adj:.4f} over {len(ts)} {fam} tests; "
                f"{round(100 * c['level'])}% two-level bootstrap over {n_w} warm starts, {n} runs)"
            )
            out.append(
                {
                    "method": m,
                    "label": summary["methods"][m]["label"],
                    "part": part,
                    "row": row,
                    "family": fam,
                    "estimate": b["estimate"],
                    "low": b["low"],
                    "high": b["high"],
                    "p_value": b["p_value"],
                    "p_holm": p_adj,
                    "tests": len(ts),
                    "holds": holds,
                    "text": text,
                }
            )
    order = {(m, row, part): i for i, (m, row, part) in enumerate(
        (m, row, part) for m in cmps for row, _, _ in METRICS for part in PARTS
    )}  # fmt: skip
    fam_rank = {"primary": 0, "exploratory": 1}
    out.sort(key=lambda x: (fam_rank[x["family"]], order[(x["method"], x["row"], x["part"])]))
    return out


def claim_lines(summary: dict[str, Any], cl: list[dict[str, Any]]) -> list[str]:
    """The printed claims: the primary family (each comparison, holding or not), the exploratory findings
    that survive Holm's correction, and the exploratory leads (uncorrected interval excludes 0 only)."""
    primary = [c for c in cl if c["family"] == "primary"]
    found = [c for c in cl if c["family"] == "exploratory" and c["holds"]]
    leads = [c for c in cl if c["family"] == "exploratory" and not c["holds"]]
    lines = [
        f"Primary claims (named before the runs; Holm's correction over {len(primary)} tests, familywise "
        f"error {ALPHA:g}):"
    ]
    lines += [f"  - [{'holds' if c['holds'] else 'not shown'}] {c['text']}" for c in primary] or [
        "  (none: the primary comparisons were not run)"
    ]
    n_expl = next((c["tests"] for c in cl if c["family"] == "exploratory"), 0)
    lines += ["", f"Exploratory findings (Holm's correction over the {n_expl} other comparisons):"]
    lines += [f"  - {c['text']}" for c in found] or ["  (none survives the correction)"]
    if leads:
        lines += [
            "",
            "Exploratory leads (the uncorrected 95% interval excludes 0, the corrected p-value does not hold; "
            "not claims):",
        ]
        lines += [f"  - {c['text']}" for c in leads]
    return lines
