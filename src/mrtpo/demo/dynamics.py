"""Curves of a demo run, not only its end point: held-out satisfaction, the KL to the warm start and the
policy's entropy every ``every`` optimizer steps, and, per sampled batch, how concentrated the token
credit is.

:func:`dynamics_callback` returns a :class:`~transformers.TrainerCallback` that a demo run adds to its
trainer. It writes into the run's ``metrics.jsonl`` (through the trainer's own metric buffer, so the
values land on the row of the step they belong to):

- every ``every`` steps and at the last step (and at step 0, before any update, as a row of its own):
  ``heldout/satisfaction``, ``heldout/local``, ``heldout/met/<type>`` (sampled responses, temperature
  1, of ``examples`` held-out prompts, sampled with the RL seed: the same random stream at every point
  and for every method of a (warm start, seed) unit), ``heldout/kl_warm_start`` (mean over the
  response tokens of ``KL(π_θ(·|ctx) || π_0(·|ctx))``, π_0 the warm start, on those responses) and
  ``heldout/entropy`` (mean token entropy of π_θ on them);
- on every step that sampled a new batch: ``credit/max_abs_token_adv`` (the largest |token advantage|
  of the batch), ``credit/max_abs_response_adv`` (the largest |Σ_k Â[j, k]|: what GDPO would put on
  every token), ``credit/token_adv_rms`` (root mean square of the token advantages over the response
  tokens), ``credit/etr`` (mean over responses with credit of the effective token ratio of |token
  advantages|) and
  ``credit/etr/<reward>`` (mean over (response, reward) pairs with a nonzero advantage of the effective
  token ratio of the scheme's weights ``w``; 1 for response-level credit).

The effective token ratio of non-negative values ``x`` over a response's T tokens is
``(Σ_t x_t)² / (T Σ_t x_t²)`` in (0, 1]: 1 when every token gets the same, 1/T when one token gets
everything; for mean-1 weights it is ``1 / mean_t w_t²``.

TRL logs the pre-clip gradient norm (``grad_norm``) and the entropy of the sampled training tokens
(``entropy``) every step; :func:`run_curves` reads all of these back from ``metrics.jsonl`` onto the
grid of curve steps (a per-step value as its mean over the steps since the previous grid point).

Recording leaves training unchanged: the held-out sampling restores torch's random state and the
model's train mode (a test compares a run with and without it). It costs one batched generation of
``examples`` prompts and two forward passes per point; its seconds are counted (``seconds``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HELDOUT_PREFIX = "heldout/"
LOCAL_TYPES = ("start", "end", "include", "wrap")
"""The toy task's constraint types decided by specific tokens (``length`` is the non-local one)."""

STEP_KEYS: tuple[str, ...] = (
    "grad_norm",
    "entropy",
    "task/satisfaction",
    "task/local",
    "task/met/length",
    "clip_ratio/region_mean",
    "frac_reward_zero_std",
    "credit/max_abs_token_adv",
    "credit/max_abs_response_adv",
    "credit/token_adv_rms",
    "credit/etr",
)
"""Per-step (or per-batch) keys that :func:`run_curves` averages over each window of the grid."""


def effective_token_ratio(x: Any, mask: Any) -> Any:
    """``(Σ_t x)² / (T Σ_t x²)`` per row over the valid tokens (``mask``) of non-negative ``x``.

    Args:
        x: [..., T] float, >= 0 on valid tokens.
        mask: [..., T] bool.

    Returns:
        [...] float; NaN for a row without a valid token or with ``Σ x = 0``.
    """
    import torch

    m = mask.to(x.dtype)
    x = x * m
    n = m.sum(-1)
    s1, s2 = x.sum(-1), (x * x).sum(-1)
    ok = (n > 0) & (s2 > 0)
    return torch.where(ok, s1 * s1 / (n * s2).clamp(min=1e-30), torch.full_like(s1, math.nan))


def credit_stats(batch: dict[str, Any], scheme: str, reward_names: Sequence[str]) -> dict[str, float]:
    """The credit metrics of one batch (``trainer.last_batch`` of :class:`mrtpo.integrations.trl.MRTPOTrainer`).

    Args:
        batch: ``advantages`` [N, K] (the gathered batch), ``token_advantages`` [B, T] or None
            (response-level credit), ``distances`` [B, K', T] or None, ``completion_mask`` [B, T] bool,
            ``process_rows`` (start, stop) of this process's rows in the N.
        scheme: the run's credit scheme (its weights are recomputed from the distances for the ratio).
        reward_names: the K reward names.

    Returns:
        ``{"credit/max_abs_token_adv", "credit/max_abs_response_adv", "credit/token_adv_rms",
        "credit/etr", "credit/etr/<name>" ...}`` (a key is absent when no row counts).
    """
    import torch

    from mrtpo import credit as credit_mod
    from mrtpo.advantages import ACTIVE_TOL

    start, stop = batch["process_rows"]
    adv = batch["advantages"][start:stop].float()  # [B, K]
    mask = batch["completion_mask"].bool()  # [B, T]
    resp = adv.sum(1)  # [B]
    tok = batch.get("token_advantages")
    tok = resp[:, None] * mask.float() if tok is None else tok.float() * mask.float()  # [B, T]
    valid = mask.any(1)
    out: dict[str, float] = {}
    if not valid.any():
        return out
    out["credit/max_abs_token_adv"] = tok.abs().max().item()
    out["credit/max_abs_response_adv"] = resp[valid].abs().max().item()
    out["credit/token_adv_rms"] = (tok.pow(2).sum() / mask.sum()).sqrt().item()
    # responses with credit (rounding leaves some advantages at 1e-9 whose squares underflow float32)
    has = tok.abs().amax(1) > ACTIVE_TOL  # [B]
    etr = effective_token_ratio(tok.abs().double(), mask)  # [B]
    etr = etr[has & ~torch.isnan(etr)]
    if etr.numel():
        out["credit/etr"] = etr.mean().item()
    active = adv.abs() > ACTIVE_TOL  # [B, K]
    d = batch.get("distances")
    spec = credit_mod.scheme(scheme)
    if d is None or spec.token_advantages is not None:
        if d is None:  # response-level credit: every weight is 1
            for k, name in enumerate(reward_names):
                if (active[:, k] & valid).any():
                    out[f"credit/etr/{name}"] = 1.0
        return out
    d = d.float()
    shared = d.shape[1] == 1
    rows_active = active.any(1, keepdim=True) if shared else active  # [B, K']
    d = torch.where(rows_active[:, :, None], torch.nan_to_num(d, nan=0.0).clamp(min=0.0), torch.zeros_like(d))
    w = credit_mod.token_weights(d, mask, credit=scheme, generator=torch.Generator().manual_seed(0))
    r = effective_token_ratio(w.double(), mask[:, None, :].expand_as(w))  # [B, K']
    names = ["joint"] if shared else list(reward_names)
    for k, name in enumerate(names):
        sel = rows_active[:, k] & valid & ~torch.isnan(r[:, k])
        if sel.any():
            out[f"credit/etr/{name}"] = r[sel, k].mean().item()
    return out


def heldout_point(
    policy, warm, tokenizer, examples, *, seed: int, max_new_tokens: int = 12
) -> dict[str, float]:
    """Held-out satisfaction of sampled responses (temperature 1) and the policy's KL to the warm start
    and entropy on them. Restores torch's random state and both models' modes.

    Returns:
        ``{"heldout/satisfaction", "heldout/local", "heldout/met/<type>", "heldout/kl_warm_start",
        "heldout/entropy"}``.
    """
    import torch

    from mrtpo.demo.warmstart import score_responses

    rng = torch.get_rng_state()
    was_training, side = policy.training, tokenizer.padding_side
    policy.eval()
    try:
        tokenizer.padding_side = "left"
        texts = [
            tokenizer.apply_chat_template(e.messages(), tokenize=False, add_generation_prompt=True)
            for e in examples
        ]
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        torch.manual_seed(seed)
        with torch.no_grad():
            ids = policy.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                pad_token_id=tokenizer.pad_token_id,
            )  # [B, P + new]
            p = enc["input_ids"].shape[1]
            new = ids[:, p:]  # [B, new]
            eos = new == tokenizer.eos_token_id  # [B, new]
            # response tokens: up to and including the first eos
            resp = (eos.cumsum(1) - eos.long()) == 0  # [B, new]
            attn = torch.cat([enc["attention_mask"], resp.long()], dim=1)  # [B, P + new]
            pos = (attn.cumsum(1) - 1).clamp(min=0)  # positions as generate gave them (left padding)
            fwd = {"input_ids": ids, "attention_mask": attn, "position_ids": pos}
            logits = policy(**fwd).logits[:, p - 1 : -1].float()  # [B, new, V]
            ref = warm(**fwd).logits[:, p - 1 : -1].float()
            lp, lq = logits.log_softmax(-1), ref.log_softmax(-1)
            kl = (lp.exp() * (lp - lq)).sum(-1)  # [B, new]
            ent = -(lp.exp() * lp).sum(-1)
            m = resp.float()
            kl_mean = float((kl * m).sum() / m.sum().clamp(min=1))
            ent_mean = float((ent * m).sum() / m.sum().clamp(min=1))
        responses = tokenizer.batch_decode(new, skip_special_tokens=True)
    finally:
        torch.set_rng_state(rng)
        policy.train(was_training)
        tokenizer.padding_side = side
    scores = score_responses(examples, responses)
    out = {f"{HELDOUT_PREFIX}satisfaction": scores["satisfaction"], f"{HELDOUT_PREFIX}local": scores["local"]}
    for name in (*LOCAL_TYPES, "length"):
        v = scores.get(name)
        if v is not None and math.isfinite(v):
            out[f"{HELDOUT_PREFIX}met/{name}"] = v
    out[f"{HELDOUT_PREFIX}kl_warm_start"] = kl_mean
    out[f"{HELDOUT_PREFIX}entropy"] = ent_mean
    return out


def dynamics_callback(
    trainer, warm_start_dir: str | Path, examples: Sequence[Any], *, every: int, seed: int, scheme: str
):
    """A callback recording the curves of :mod:`mrtpo.demo.dynamics` into ``trainer``'s metrics.

    Args:
        trainer: the run's :class:`~mrtpo.integrations.trl.MRTPOTrainer` (its metric buffer and
            ``last_batch`` are read).
        warm_start_dir: the warm start the run started from (π_0 of the KL).
        examples: held-out prompts.
        every: optimizer steps between points (> 0).
        seed: seed of the held-out sampling.
        scheme: the run's credit scheme.
    """
    from transformers import TrainerCallback

    from mrtpo.demo.warmstart import load_warm_start
    from mrtpo.integrations.trl.run_logging import append_jsonl

    if every < 1:
        raise ValueError(f"every must be >= 1, got {every}")
    warm, _, _ = load_warm_start(warm_start_dir)
    warm.eval()
    for p in warm.parameters():
        p.requires_grad_(False)

    class DynamicsCallback(TrainerCallback):
        def __init__(self) -> None:
            self.seconds = 0.0
            self.points = 0
            self._batch_id: int | None = None

        def _point(self, model) -> dict[str, float]:
            t0 = time.perf_counter()
            out = heldout_point(model, warm, trainer.processing_class, examples, seed=seed)
            self.seconds += time.perf_counter() - t0
            self.points += 1
            return out

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            if state.global_step == 0 and state.is_world_process_zero:
                row = {"step": 0, **self._point(model or trainer.model)}
                append_jsonl(Path(args.output_dir) / "metrics.jsonl", [row])

        def on_step_end(self, args, state, control, model=None, **kwargs):
            t0 = time.perf_counter()
            metrics = trainer._metrics["train"]  # TRL averages these into the step's log row
            batch = getattr(trainer, "last_batch", None)
            if batch is not None and id(batch) != self._batch_id:
                self._batch_id = id(batch)
                for key, value in credit_stats(batch, scheme, trainer.reward_names).items():
                    metrics[key].append(value)
            self.seconds += time.perf_counter() - t0
            if state.global_step % every == 0 or state.global_step == state.max_steps:
                for key, value in self._point(model or trainer.model).items():
                    metrics[key].append(value)

    return DynamicsCallback()


def run_curves(rows: Sequence[dict[str, Any]], every: int, last_step: int) -> dict[str, Any]:
    """The curves of one run on the grid ``0, every, 2·every, ..., last_step`` (the last step added
    when it is not a multiple).

    Held-out keys (``heldout/*``) are read at the grid steps; a per-step key (:data:`STEP_KEYS` and
    ``credit/etr/<reward>``) is averaged over the logged values in ``(previous grid step, step]``.
    None where nothing was logged.

    Args:
        rows: metrics.jsonl rows.
        every: the grid spacing (the run's recording interval).
        last_step: the run's last optimizer step.

    Returns:
        ``{"steps": [grid], key: [value or None per grid step], ...}``.
    """
    grid = list(range(0, last_step + 1, every))
    if grid[-1] != last_step:
        grid.append(last_step)
    keys = sorted(
        {
            k
            for r in rows
            for k in r
            if k.startswith(HELDOUT_PREFIX) or k in STEP_KEYS or k.startswith("credit/etr/")
        }
    )
    out: dict[str, Any] = {"steps": grid}
    for key in keys:
        by_step: dict[int, float] = {}
        for r in rows:
            v = r.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                by_step[int(r["step"])] = float(v)
        if key.startswith(HELDOUT_PREFIX):
            out[key] = [by_step.get(s) for s in grid]
            continue
        vals: list[float | None] = []
        prev = -1
        for s in grid:
            window = [v for st, v in by_step.items() if prev < st <= s]
            vals.append(sum(window) / len(window) if window else None)
            prev = s
        out[key] = vals
    local = [out[f"credit/etr/{t}"] for t in LOCAL_TYPES if f"credit/etr/{t}" in out]
    if local:  # the mean over the localizable rewards present at each point
        out["credit/etr/localizable"] = [
            (sum(v) / len(v)) if (v := [x[i] for x in local if x[i] is not None]) else None
            for i in range(len(grid))
        ]
    return out
