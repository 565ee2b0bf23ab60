"""One saved response with its per-token credit: the record of samples.jsonl (docs/run-format.md).

The trainer writes :class:`SampleRecord` objects (``to_json``), ``mrtpo explain`` and ``mrtpo report``
read them back (``from_json``), which checks every field once and names the one that is wrong.

Core module: standard library only. Notation: K rewards, T response tokens, K' distance rows (K, or 1
for a shared row).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["SampleRecord", "information_spans"]


def _numbers(value: Any, name: str, size: int | None = None, *, nonnegative: bool = False) -> list[float]:
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{name} must be a list of numbers, got {type(value).__name__}")
    out = []
    for i, x in enumerate(value):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            raise ValueError(f"{name}[{i}] = {x!r}; expected a finite number")
        if nonnegative and x < 0:
            raise ValueError(f"{name}[{i}] = {x}; distances are >= 0")
        out.append(float(x))
    if size is not None and len(out) != size:
        raise ValueError(f"{name} has {len(out)} entries; expected {size}")
    return out


def information_spans(prompt: str, segments: Any, names: list[str]) -> dict[str, list[list[int]]]:
    """Where each reward's information sits in ``prompt``: reward name -> character spans
    ``[[start, end], ...]`` of the rollout segments tagged with it (:class:`mrtpo.prompt.Segment`:
    ``text``, ``rewards``, ``privileged``), found in prompt order (system segments, then user ones).

    A privileged segment (not in the rollout prompt) or a text not found in ``prompt`` has no span;
    rewards without any span are absent.
    """
    ordered = [s for s in segments if getattr(s, "role", "user") == "system"]
    ordered += [s for s in segments if getattr(s, "role", "user") != "system"]
    out: dict[str, list[list[int]]] = {}
    pos = 0
    for seg in ordered:
        tags = [n for n in names if n in seg.rewards]
        if not tags or seg.privileged or not seg.text:
            continue
        at = prompt.find(seg.text, pos)
        if at < 0:
            at = prompt.find(seg.text)
        if at < 0:
            continue
        pos = at + len(seg.text)
        for n in tags:
            out.setdefault(n, []).append([at, pos])
    return out


def _information(value: Any, names: list[str], prompt: Any, where: str) -> dict[str, list[list[int]]]:
    """The checked ``information`` field: reward name -> ``[[start, end], ...]`` within the prompt."""
    if not isinstance(value, dict):
        raise ValueError(f"{where}: information must be an object of reward name -> [[start, end], ...]")
    limit = len(prompt) if isinstance(prompt, str) else None
    out = {}
    for name, spans in value.items():
        if name not in names:
            continue
        ok = isinstance(spans, list) and all(
            isinstance(sp, list)
            and len(sp) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) for x in sp)
            and 0 <= sp[0] <= sp[1]
            and (limit is None or sp[1] <= limit)
            for sp in spans
        )
        if not ok:
            within = f" within the prompt's {limit} characters" if limit is not None else ""
            raise ValueError(f"{where}: information[{name!r}] must be a list of [start, end] spans{within}")
        out[name] = [list(sp) for sp in spans]
    return out


@dataclass
class SampleRecord:
    """A response, its rewards, response-level advantages and per-token credit.

    Attributes:
        tokens: [T] token strings of the response.
        reward_names: [K].
        advantages: [K] response-level advantages Â of the run's method.
        distances: None (no replay, or a replay kind whose measure is signed: no distances to show) or
            [K'] rows of [T] values of the replay kind's measure; a None row is a row replay did not run
            (the kind's rule, e.g. |Â[k]| <= 1e-8 for ``reward``): it weighs 1. One row is shared by all
            rewards (joint, CoRT, a user's shared-row kind).
        step: optimizer step (None for a record of ``mrtpo explain``'s live mode).
        prompt, response: texts.
        rewards: [K] reward values.
        method, credit, credit_beta: the run's advantage method, credit scheme and allocation strength β
            (``"credit_beta"`` in the JSON; records of earlier versions have ``"beta"``, read the same).
        replay: the replay kind of the credit scheme (None: no replay, or a record of an earlier version).
        rows: [K'] the names of the distance rows (the kind's :meth:`~mrtpo.replay.ReplayKind.row_names`:
            the reward names, or the name of the shared row); None in records of earlier versions
            (:attr:`row_names` infers them).
        attributed: [K'] True where the row holds token weights (mean 1 over the tokens, from a scorer's
            gradient: the replay kind ``gradient``), not distances; None: every row holds distances. The
            views draw such a row as weights and the localization tables leave it out.
        token_advantages: [T] S under the run's credit.
        checked_tokens: reward name -> [T] 0/1 tokens its verifier reads.
        information: reward name -> character spans ``[start, end)`` of ``prompt`` holding the
            information its verifier checks (:func:`information_spans`).
        example_id: the example's id.
        notes: lines shown with the record.
        extra: other keys of the JSON object (kept as they are).
    """

    tokens: list[str]
    reward_names: list[str]
    advantages: list[float]
    distances: list[list[float] | None] | None = None
    step: int | None = None
    prompt: str | None = None
    response: str | None = None
    rewards: list[float] | None = None
    method: str | None = None
    credit: str | None = None
    credit_beta: float | None = None
    replay: str | None = None
    rows: list[str] | None = None
    attributed: list[bool] | None = None
    token_advantages: list[float] | None = None
    checked_tokens: dict[str, list[int]] | None = None
    information: dict[str, list[list[int]]] | None = None
    example_id: str | None = None
    notes: list[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def row_names(self) -> list[str]:
        """The names of the distance rows: ``rows``, or for a record of an earlier version the reward
        names (K rows) or ``["joint"]`` (one shared row); [] without distances."""
        if self.distances is None:
            return list(self.rows or [])
        if self.rows is not None:
            return list(self.rows)
        return list(self.reward_names) if len(self.distances) == len(self.reward_names) else ["joint"]

    def holds_weights(self, row: int) -> bool:
        """Row ``row`` of ``distances`` holds token weights (``attributed``), not distances."""
        return self.attributed is not None and bool(self.attributed[row])

    @property
    def per_reward(self) -> bool:
        """One distance row per reward (row k belongs to reward k); else one row shared by all rewards."""
        return self.row_names == list(self.reward_names)

    def to_json(self) -> dict[str, Any]:
        """The samples.jsonl object: the format's keys in order; optional keys only when not None."""
        out: dict[str, Any] = {
            "step": self.step,
            "prompt": self.prompt,
            "response": self.response,
            "tokens": self.tokens,
            "reward_names": self.reward_names,
            "rewards": self.rewards,
            "advantages": self.advantages,
            "method": self.method,
            "credit": self.credit,
            "credit_beta": self.credit_beta,
            "replay": self.replay,
            "rows": self.rows,
            "distances": self.distances,
            "token_advantages": self.token_advantages,
        }
        for key in ("attributed", "checked_tokens", "information", "example_id", "notes"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        out.update(self.extra)
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any] | str, where: str = "record") -> SampleRecord:
        """Parse and check a samples.jsonl object (or its JSON text).

        Raises:
            ValueError: a missing or malformed field, naming ``where`` and the field.
        """
        if isinstance(obj, str):
            try:
                obj = json.loads(obj)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: invalid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        for key in ("tokens", "reward_names", "advantages", "distances"):
            if key not in obj:
                raise ValueError(f"{where}: field {key!r} is missing")
        names = obj["reward_names"]
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise ValueError(f"{where}: reward_names must be a non-empty list of strings")
        k = len(names)
        tokens = obj["tokens"]
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise ValueError(f"{where}: tokens must be a list of strings")
        if not tokens:
            raise ValueError(f"{where}: tokens is empty; nothing to explain")
        t_len = len(tokens)
        rows = obj["distances"]
        if rows is not None:
            if not isinstance(rows, list) or len(rows) not in (k, 1):
                got = len(rows) if isinstance(rows, list) else type(rows).__name__
                raise ValueError(
                    f"{where}: distances has {got} rows; expected K={k} (one per reward) or 1 (one shared row)"
                )
            rows = [
                None if row is None else _numbers(row, f"{where}: distances[{i}]", t_len, nonnegative=True)
                for i, row in enumerate(rows)
            ]
        row_names = obj.get("rows")
        if row_names is not None:
            if not isinstance(row_names, list) or not all(isinstance(r, str) for r in row_names):
                raise ValueError(f"{where}: rows must be a list of row names (strings) or null")
            if rows is not None and len(row_names) != len(rows):
                raise ValueError(
                    f"{where}: rows names {len(row_names)} rows but distances has {len(rows)}; expected one name per row"
                )
        attributed = obj.get("attributed")
        if attributed is not None:
            n_rows = len(rows) if rows is not None else None
            if (
                not isinstance(attributed, list)
                or not all(isinstance(x, bool) for x in attributed)
                or (n_rows is not None and len(attributed) != n_rows)
            ):
                raise ValueError(
                    f"{where}: attributed must be a list of {n_rows if n_rows is not None else 'K'} true/false "
                    "(one per distance row: true where the row holds token weights)"
                )
        checked = obj.get("checked_tokens")
        if checked is not None and not isinstance(checked, dict):
            raise ValueError(f"{where}: checked_tokens must be an object of reward name -> [T] 0/1 list")
        checked_out = None if checked is None else {}
        for name, row in (checked or {}).items():
            if name not in names:
                continue
            if not isinstance(row, list) or len(row) != t_len:
                raise ValueError(f"{where}: checked_tokens[{name!r}] must be a list of {t_len} 0/1 values")
            checked_out[name] = [int(bool(x)) for x in row]
        information = obj.get("information")
        if information is not None:
            information = _information(information, names, obj.get("prompt"), where)
        beta_key = "credit_beta" if "credit_beta" in obj or "beta" not in obj else "beta"  # "beta": earlier
        step, beta = obj.get("step"), obj.get(beta_key)
        if step is not None and (isinstance(step, bool) or not isinstance(step, (int, float))):
            raise ValueError(f"{where}: step must be an integer or null; got {step!r}")
        if beta is not None and (isinstance(beta, bool) or not isinstance(beta, (int, float))):
            raise ValueError(f"{where}: {beta_key} must be a number or null; got {beta!r}")
        known = {f.name for f in fields(cls)} | {"beta"}
        opt_numbers = {
            key: None if obj.get(key) is None else _numbers(obj[key], f"{where}: {key}", size)
            for key, size in (("rewards", k), ("token_advantages", t_len))
        }

        def text(key: str) -> str | None:
            v = obj.get(key)
            return None if v is None else str(v)

        return cls(
            tokens=list(tokens),
            reward_names=list(names),
            advantages=_numbers(obj["advantages"], f"{where}: advantages", k),
            distances=rows,
            step=None if step is None else int(step),
            prompt=text("prompt"),
            response=text("response"),
            rewards=opt_numbers["rewards"],
            method=text("method"),
            credit=text("credit"),
            credit_beta=None if beta is None else float(beta),
            replay=text("replay"),
            rows=None if row_names is None else list(row_names),
            attributed=None if attributed is None else list(attributed),
            token_advantages=opt_numbers["token_advantages"],
            checked_tokens=checked_out,
            information=information,
            example_id=text("example_id"),
            notes=None if obj.get("notes") is None else [str(n) for n in obj["notes"]],
            extra={key: v for key, v in obj.items() if key not in known},
        )
