"""Credit you can audit, per reward: each reward's part of the advantage and how concentrated its token weights are.

Per reward k of a batch (docs/methods.md, "Auditing the credit"):

    adv_abs_mean[k]          = mean_j |Â[j, k]|
    adv_share[k]             = Σ_j |Â[j, k]| / Σ_{j, l} |Â[j, l]|          (the shares sum to 1)
    gini[j, k]               = Σ_{t, u} |w_t − w_u| / (2 T² mean(w))        over row (j, k)'s T valid tokens
    effective_token_ratio    = exp(H(w / Σ w)) / T                          H: entropy (nats)
    top_token_repeat[k]      = (q − 1/R) / (1 − 1/R), q the largest share of the R rows whose most-weighted
                               token is one same token id (its floor 1/R removed: 0 at chance, 1 all on one)

Gini is 0 for uniform weights and (T − 1) / T when one token holds everything; the effective token ratio
is 1 for uniform weights and 1 / T for one token (exp(H) is the number of tokens the weights are
effectively spread over). Only rows whose weights act are counted: ``|Â[j, k]| > ACTIVE_TOL`` and, where
replay skipped a row, not that row.

:func:`audit_warnings` reads these metrics over steps and names a reward whose weights stay near uniform
(the credit is the response-level one, replay or attribution does not localize it) or pile on a few
tokens that are the same across responses (template tokens such as a format tag): the failure modes that
ARCA (arXiv 2606.00257) reports for divergence-based token credit under LoRA. The thresholds are this
project's (:data:`UNIFORM_ETR`, :data:`PILED_ETR`, :data:`PILED_REPEAT`, :data:`WINDOW`).

Core module: torch and the standard library only.

Notation: N responses, K rewards, K' weight rows (K, or 1 shared), T tokens.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from mrtpo.advantages import ACTIVE_TOL

__all__ = [
    "METRICS",
    "PILED_ETR",
    "PILED_REPEAT",
    "UNIFORM_ETR",
    "WINDOW",
    "AuditLog",
    "advantage_components",
    "audit_parts",
    "audit_warnings",
    "batch_audit",
    "effective_token_ratio",
    "gini",
    "metric_key",
    "response_audit",
    "result_parts",
    "top_token_repeat",
]

METRICS = ("adv_abs_mean", "adv_share", "gini", "effective_token_ratio", "top_token_repeat")
"""The per-reward metrics, logged as ``credit/<reward>/<metric>``."""

UNIFORM_ETR = 0.95
"""A reward's weights are near uniform when the median effective token ratio of the window is at least this."""
PILED_ETR = 0.25
"""... and piled on a few tokens when it is at most this ..."""
PILED_REPEAT = 0.5
"""... while the median top-token repeat is at least this (the same token on top in half the responses)."""
WINDOW = 20
"""Logged steps the rule looks at (the last ones); fewer steps with data: no warning."""


def metric_key(reward: str, metric: str) -> str:
    """``credit/<reward>/<metric>``, the key in metrics.jsonl."""
    return f"credit/{reward}/{metric}"


def advantage_components(advantages: Tensor) -> tuple[Tensor, Tensor]:
    """Each reward's part of the advantages ``[N, K]``: ``(mean_j |Â[j, k]|, Σ_j |Â[j, k]| / Σ |Â|)``, both
    ``[K]`` float32 (shares all 0 when every advantage is 0)."""
    a = torch.as_tensor(advantages).detach().float().abs()
    if a.dim() != 2:
        raise ValueError(f"advantages has shape {tuple(a.shape)}; expected (N, K)")
    per = a.sum(0)
    total = per.sum()
    share = per / total if float(total) > 0 else torch.zeros_like(per)
    return a.mean(0) if a.shape[0] else torch.zeros_like(per), share


def _rows(weights: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    w = torch.as_tensor(weights).detach().float()
    m = torch.as_tensor(mask).bool().to(w.device)
    if w.shape != m.shape:
        raise ValueError(
            f"weights has shape {tuple(w.shape)} and mask {tuple(m.shape)}; expected equal [..., T]"
        )
    if bool((w[m] < 0).any()) or not bool(torch.isfinite(w[m]).all()):
        raise ValueError("weights must be finite and >= 0 on valid tokens")
    return torch.where(m, w, torch.zeros_like(w)), m


def gini(weights: Tensor, mask: Tensor) -> Tensor:
    """The Gini coefficient of each row's weights over its valid tokens ``[..., T]`` -> ``[...]``.

    ``G = Σ_i (2i − T − 1) w_(i) / (T Σ w)`` with ``w_(1) <= ... <= w_(T)`` (equal to
    ``Σ_{t,u} |w_t − w_u| / (2 T² mean w)``); 0 for a row of one token, a row without valid tokens, or all
    zeros.
    """
    w, m = _rows(weights, mask)
    t = m.sum(-1).float()  # [...]
    # padding sorts first as -1 (weights are >= 0), so valid values take ranks T_pad - T + 1 .. T_pad
    s = torch.where(m, w, torch.full_like(w, -1.0)).sort(-1).values
    n = w.shape[-1]
    rank = torch.arange(1, n + 1, dtype=w.dtype, device=w.device) - (n - t)[..., None]  # valid: 1 .. T
    valid = s >= 0
    coef = torch.where(valid, 2 * rank - t[..., None] - 1, torch.zeros_like(s))
    total = w.sum(-1)
    g = (coef * s.clamp(min=0)).sum(-1) / (t * total).clamp(min=torch.finfo(w.dtype).tiny)
    return torch.where((t > 1) & (total > 0), g, torch.zeros_like(g))


def effective_token_ratio(weights: Tensor, mask: Tensor) -> Tensor:
    """``exp(H(p)) / T`` with ``p = w / Σ w`` over each row's T valid tokens ``[..., T]`` -> ``[...]``; 1 for
    uniform weights, 1 / T for one token; 1 for a row without valid tokens or all zeros."""
    w, m = _rows(weights, mask)
    t = m.sum(-1).float()
    total = w.sum(-1, keepdim=True)
    p = w / total.clamp(min=torch.finfo(w.dtype).tiny)
    h = -(torch.where(p > 0, p * p.log(), torch.zeros_like(p))).sum(-1)
    r = h.exp() / t.clamp(min=1)
    return torch.where((t > 0) & (total[..., 0] > 0), r, torch.ones_like(r))


def top_token_repeat(weights: Tensor, mask: Tensor, token_ids: Tensor) -> float:
    """How much more than by chance the rows of ``weights [R, T]`` peak on one same token id (``token_ids
    [R, T]``): ``(q − 1/R) / (1 − 1/R)`` with q the largest share of rows whose most-weighted valid token is
    one id. The share q cannot be below 1/R (one row always shares its peak with itself), so q alone would
    read 0.5 on 2 rows that peak on different tokens; corrected, every row peaking on a different token
    gives 0 and all on one (a template token) gives 1. Rows without valid tokens are left out; 0 when fewer
    than 2 rows are left (one row says nothing of repetition)."""
    w, m = _rows(weights, mask)
    ok = m.any(-1)
    r = int(ok.sum())
    if r < 2:
        return 0.0
    top = torch.where(m, w, torch.full_like(w, -1.0)).argmax(-1)  # [R]
    ids = torch.as_tensor(token_ids).to(w.device).gather(-1, top[:, None])[:, 0][ok]
    q = float(torch.unique(ids, return_counts=True)[1].max()) / r
    return (q - 1.0 / r) / (1.0 - 1.0 / r)


def audit_parts(
    advantages: Tensor,
    weights: Tensor | None,
    mask: Tensor,
    names: Sequence[str],
    *,
    used: Tensor | None = None,
    token_ids: Tensor | None = None,
    local: Tensor | None = None,
    rows: Sequence[str] | None = None,
) -> dict[str, tuple[float, float]]:
    """The audit metrics of one process's part of a batch as ``{credit/<row>/<metric>: (sum, count)}``.

    An engine sums both over its processes and logs ``sum / count`` where ``count > 0`` (as a credit
    scheme's metrics, :data:`mrtpo.credit.MetricsFn`): the advantage components come from the gathered
    advantages, the same on every process, as ``(value, 1)``; ``gini`` and ``effective_token_ratio`` as
    (sum over the used rows, their number); ``top_token_repeat`` as (the local share x the used rows, the
    used rows): over processes, the mean of the local shares weighted by their rows. The key set depends on
    the arguments' shapes only (a row no response uses is ``(0, 0)``), so every process sends the same
    names.

    Args:
        advantages: [N, K] the batch's advantages Â (the advantage components are those of all N).
        weights: [B, K', T] the token weights the credit scheme gave the local responses (mean 1 over the
            valid tokens); None: response-level credit (only the advantage components).
        mask: [B, T] valid tokens.
        names: [K] reward names.
        used: [B, K'] rows whose weights act (an engine passes the replay's ``replayed`` rows); default:
            the rows of the rewards with ``|local| > ACTIVE_TOL`` (K' = K only).
        token_ids: [B, T] response token ids (for ``top_token_repeat``).
        local: [B, K] the local rows of the advantages (default: ``advantages`` when B = N).
        rows: [K'] the names of the weight rows (the replay kind's
            :meth:`~mrtpo.replay.ReplayKind.row_names`); default: ``names`` (K' = K only).
    """
    adv = torch.as_tensor(advantages).detach().float().cpu()
    if adv.dim() != 2 or adv.shape[1] != len(names):
        raise ValueError(f"advantages has shape {tuple(adv.shape)}; expected (N, K) with K = {len(names)}")
    out: dict[str, tuple[float, float]] = {}
    mean, share = advantage_components(adv)
    for k, name in enumerate(names):
        out[metric_key(name, "adv_abs_mean")] = (float(mean[k]), 1.0)
        out[metric_key(name, "adv_share")] = (float(share[k]), 1.0)
    if weights is None:
        return out
    w = torch.as_tensor(weights).detach().float()
    m = torch.as_tensor(mask).bool().to(w.device)
    kk = w.shape[1]
    rows = list(names) if rows is None else list(rows)
    if len(rows) != kk:
        raise ValueError(
            f"weights has {kk} rows per response and rows names {len(rows)}; name each row (rows=)"
        )
    if used is None:
        if kk != len(names):
            raise ValueError(
                f"weights has {kk} rows, not one per reward (K={len(names)}): give the rows used"
            )
        loc = (adv if local is None else torch.as_tensor(local).detach().float()).to(w.device)
        used = loc.abs() > ACTIVE_TOL
    used = torch.as_tensor(used).bool().to(w.device)
    for k, name in enumerate(rows):
        sel = used[:, k]
        n = int(sel.sum())
        if not n:
            for metric in (
                "gini",
                "effective_token_ratio",
                *(("top_token_repeat",) if token_ids is not None else ()),
            ):
                out[metric_key(name, metric)] = (0.0, 0.0)
            continue
        wk, mk = w[sel, k], m[sel]
        out[metric_key(name, "gini")] = (float(gini(wk, mk).sum()), float(n))
        out[metric_key(name, "effective_token_ratio")] = (
            float(effective_token_ratio(wk, mk).sum()),
            float(n),
        )
        if token_ids is not None:
            ids = torch.as_tensor(token_ids).to(w.device)[sel]
            out[metric_key(name, "top_token_repeat")] = (top_token_repeat(wk, mk, ids) * n, float(n))
    return out


def result_parts(
    result: Any, mask: Tensor, names: Sequence[str], token_ids: Tensor | None = None
) -> dict[str, tuple[float, float]]:
    """:func:`audit_parts` of a credit step's result (:class:`mrtpo.step.CreditResult`) on this process's
    responses, and ``replay/attributed``: the share of its rows whose weights came from a scorer's gradient.

    The weights are those the allocation mixed (``result.weights``: a shuffled scheme's own permutation
    included), the rows replay did not measure left out; a scheme without replay, or one that computes its
    own token advantages (RLSD's clipped ratios are not mean-1 weights), gets the advantage components only.

    Args:
        result: the credit step's result (``advantages [N, K]``, ``local [B, K]``, ``weights``,
            ``replayed``, ``rows``, ``scheme``, ``replay_stats``).
        mask: [B, T] the tokens that took credit.
        names: [K] reward names.
        token_ids: [B, T] response token ids (for ``top_token_repeat``).
    """

    s = result.scheme
    weights = used = None
    m = torch.as_tensor(mask).bool()
    if s.kind is not None and s.mixes_weights and result.weights is not None:
        used = None if result.replayed is None else result.replayed.cpu()
        weights = result.weights.detach().float().cpu()
    out = audit_parts(
        result.advantages,
        weights,
        m.cpu(),
        names,
        used=used,
        token_ids=None if token_ids is None else torch.as_tensor(token_ids).cpu(),
        local=result.local.cpu(),
        rows=None if weights is None else result.rows,
    )
    st = result.replay_stats
    if st is not None and weights is not None:
        out["replay/attributed"] = (float(st.attributed), float(weights.shape[0] * weights.shape[1]))
    return out


def batch_audit(*args: Any, **kwargs: Any) -> dict[str, float]:
    """The audit metrics of one batch (one process), keyed ``credit/<reward>/<metric>``: the values of
    :func:`audit_parts` (same arguments), ``sum / count``.

    Returns:
        ``{credit/<reward>/adv_abs_mean, adv_share}`` for every reward and, for a row with at least one
        used response, ``gini``, ``effective_token_ratio`` (means over the used responses) and
        ``top_token_repeat``.
    """
    parts = audit_parts(*args, **kwargs)
    return {key: s / c for key, (s, c) in parts.items() if c > 0}


def response_audit(weights: Tensor, names: Sequence[str], used: Sequence[bool] | None = None) -> str:
    """One line of the concentration of one response's token weights ``[K', T]`` (all valid), per row:
    ``credit audit: <row> Gini g, effective token ratio r; ...`` (rows named by ``names``, K' of them; rows
    with ``used`` False are left out). What ``mrtpo explain`` shows under a response."""
    w = torch.as_tensor(weights).detach().float()
    if w.dim() != 2 or w.shape[0] != len(names):
        raise ValueError(f"weights has shape {tuple(w.shape)}; expected [K', T] with K' = {len(names)}")
    m = torch.ones_like(w, dtype=torch.bool)
    g, r = gini(w, m), effective_token_ratio(w, m)
    keep = [True] * len(names) if used is None else [bool(u) for u in used]
    parts = [
        f"{name} Gini {float(g[i]):.3f}, effective token ratio {float(r[i]):.3f}"
        for i, name in enumerate(names)
        if keep[i]
    ]
    return "credit audit: " + ("; ".join(parts) if parts else "no row carries token weights")


class AuditLog:
    """The audit metrics of a run's last :data:`WINDOW` logged steps and the warning lines said so far: each
    engine's trainer adds a step's values with :meth:`add` and logs the lines it returns.

    Args:
        reward_names: the K reward names.
    """

    def __init__(self, reward_names: Sequence[str]):
        self.reward_names = list(reward_names)
        self.history: list[dict[str, float]] = []
        self.warned: set[str] = set()

    def add(self, step: int, values: Mapping[str, float]) -> list[str]:
        """Add a step's audit metrics (``credit/<reward>/<metric>``); returns the lines of
        :func:`audit_warnings` over the window that were not returned before (once per reward and failure
        mode: near uniform, piled)."""
        self.history.append({"step": step, **values})
        del self.history[:-WINDOW]
        new = []
        for line in audit_warnings(self.history, self.reward_names):
            key = line.split(":", 1)[0] + (" uniform" if "near uniform" in line else " piled")
            if key not in self.warned:
                self.warned.add(key)
                new.append(line)
        return new


def _rows_of(history: Sequence[Mapping[str, float]], names: Sequence[str]) -> list[str]:
    """``names``, then the other rows whose effective token ratio the history holds, in order of appearance."""
    out = list(names)
    for h in history:
        for key in h:
            if key.startswith("credit/") and key.endswith("/effective_token_ratio"):
                row = key[len("credit/") : -len("/effective_token_ratio")]
                if row not in out:
                    out.append(row)
    return out


def audit_warnings(
    history: Sequence[Mapping[str, float]],
    names: Sequence[str],
    *,
    window: int = WINDOW,
    uniform_etr: float = UNIFORM_ETR,
    piled_etr: float = PILED_ETR,
    piled_repeat: float = PILED_REPEAT,
) -> list[str]:
    """One line per reward whose token weights stayed near uniform or piled on a few repeated tokens.

    Over the last ``window`` logged steps that have the reward's effective token ratio (rows of metrics.jsonl
    or the trainer's logs, oldest first), with ``r`` their median effective token ratio and ``q`` their
    median top-token repeat:

    - near uniform: ``r >= uniform_etr``;
    - piled on template tokens: ``r <= piled_etr`` and ``q >= piled_repeat``.

    The rows looked at are ``names`` and every other row the history has metrics of (a replay kind's
    shared row). Fewer than ``window`` such steps: no line for that row.
    """
    lines = []
    for name in _rows_of(history, names):
        key = metric_key(name, "effective_token_ratio")
        rows = [h for h in history if isinstance(h.get(key), (int, float)) and math.isfinite(h[key])]
        if len(rows) < window or window < 1:
            continue
        rows = rows[-window:]
        r = statistics.median(float(h[key]) for h in rows)
        g = statistics.median(float(h.get(metric_key(name, "gini"), 0.0)) for h in rows)
        steps = f"steps {rows[0].get('step', '?')}-{rows[-1].get('step', '?')}"
        if r >= uniform_etr:
            lines.append(
                f"credit/{name}: token weights near uniform over the last {window} logged steps ({steps}; median "
                f"effective token ratio {r:.3f} >= {uniform_etr}, Gini {g:.3f}): this reward's credit is "
                "close to the response-level one"
            )
            continue
        rep_key = metric_key(name, "top_token_repeat")
        reps = [float(h[rep_key]) for h in rows if isinstance(h.get(rep_key), (int, float))]
        q = statistics.median(reps) if reps else 0.0
        if r <= piled_etr and q >= piled_repeat:
            lines.append(
                f"credit/{name}: token weights piled on a few tokens over the last {window} logged steps ({steps}; "
                f"median effective token ratio {r:.3f} <= {piled_etr}, Gini {g:.3f}) and one same token on top of "
                f"responses beyond chance (top-token repeat {q:.2f}, 0 at chance): a template token, not the "
                "content this reward checks?"
            )
    return lines
