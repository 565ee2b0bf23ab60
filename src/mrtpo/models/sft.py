"""Supervised warm starts: the model, optimizer, learning-rate shape, loss and step a warm start trains
with, and how it is saved (the demo's toy task, :mod:`mrtpo.demo.warmstart`; the SQL task's,
:mod:`mrtpo.tasks.sql.warmstart`; the tools task's, :mod:`mrtpo.tasks.tools.warmstart`)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = [
    "labelled_response_loss",
    "lr_factor",
    "new_model",
    "new_optimizer",
    "response_loss",
    "save_warm_start",
    "sft_step",
    "train_on_demonstrations",
]


@dataclass
class WarmStartSettings:
    """The settings every task's laptop warm start shares (a task's config adds its own and may change the
    defaults): model size, optimizer, schedule, seed, and how many examples its evaluation reads."""

    steps: int = 300
    batch_size: int = 32
    lr: float = 3e-3
    warmup_steps: int = 20
    weight_decay: float = 0.01
    hidden_size: int = 128
    num_layers: int = 2
    seed: int = 0
    eval_limit: int = 64

    def check_at_least_one(self, *names: str) -> None:
        """ValueError naming every one of ``names`` (and its value) when any is below 1."""
        if any(getattr(self, name) < 1 for name in names):
            values = ", ".join(str(getattr(self, name)) for name in names)
            raise ValueError(f"{', '.join(names)} must be >= 1, got {values}")

    def check_probabilities(self, *names: str) -> None:
        """ValueError naming the first of ``names`` outside [0, 1]."""
        for name in names:
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")


def add_settings_arguments(parser, defaults) -> None:
    """One ``--name`` option per field of the settings dataclass ``defaults`` (its value the default)."""
    for name, value in asdict(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)


def settings_from_args(cls, args):
    """The settings of class ``cls`` from the options :func:`add_settings_arguments` added."""
    return cls(**{k: getattr(args, k) for k in asdict(cls())})


def lr_factor(
    step: int, warmup: int, total: int, decay_start: int | None = None, floor: float = 0.1
) -> float:
    """Learning-rate multiplier: linear warm-up, constant until ``decay_start``, cosine down to ``floor``.

    ``f(s) = (s + 1) / warmup`` for ``s < warmup``; ``1`` for ``s < decay_start``; then
    ``floor + (1 - floor) * (1 + cos(pi * p)) / 2`` with ``p = (s - d) / max(1, total - d)`` (clipped
    to 1) and ``d = max(warmup, decay_start)`` (``decay_start=None``: right after the warm-up).
    """
    if step < warmup:
        return (step + 1) / warmup
    d = warmup if decay_start is None else max(warmup, decay_start)
    if step < d:
        return 1.0
    progress = min(1.0, (step - d) / max(1, total - d))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def response_loss(model, ids, mask, labels):
    """Mean next-token cross-entropy over the labelled positions.

    ``loss = mean_{(b, t): labels[b, t] != -100} -log p(ids[b, t] | ids[b, < t])``.
    """
    import torch.nn.functional as F

    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]  # [B, W-1, V]
    target = labels[:, 1:]  # [B, W-1]
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1), ignore_index=-100
    )


def labelled_response_loss(model, ids, mask, labels):
    """:func:`response_loss` with the LM head applied to the labelled positions only (long prompts, large
    vocabularies: the full ``[B, W, V]`` logits are never formed). Same value up to rounding.

    ``loss = mean_{(b, t): labels[b, t] != -100} -log p(ids[b, t] | ids[b, < t])``.
    """
    import torch.nn.functional as F

    hidden = model.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state[:, :-1]  # [B, W-1, H]
    target = labels[:, 1:]  # [B, W-1]
    keep = target != -100
    logits = model.get_output_embeddings()(hidden[keep])  # [N, V]
    return F.cross_entropy(logits.float(), target[keep])


def encode_pairs(tok, prompts: list[list[int]], responses: list[list[int]]):
    """``input_ids, attention_mask, labels`` of (prompt ids, response ids) pairs: prompts left-padded,
    responses (plus ``<eos>``) right-padded, labels -100 except on response tokens and ``<eos>``."""
    import torch

    p_len = max(map(len, prompts))
    r_len = max(map(len, responses)) + 1
    ids = torch.full((len(prompts), p_len + r_len), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        r = [*r, tok.eos_token_id]
        ids[i, p_len - len(p) : p_len] = torch.tensor(p)
        ids[i, p_len : p_len + len(r)] = torch.tensor(r)
        mask[i, p_len - len(p) : p_len + len(r)] = 1
        labels[i, p_len : p_len + len(r)] = torch.tensor(r)
    return ids, mask, labels


def new_model(tok, config, *, max_positions: int):
    """A float32 tiny model (:func:`mrtpo.models.tiny.build_model`) over ``tok``'s vocabulary whose
    generation ends and pads with ``tok``'s tokens. ``config``: a warm start's settings (``hidden_size``,
    ``num_layers``, ``seed``; ``num_heads``, ``num_kv_heads`` where it has them, else the tiny model's)."""
    import torch

    from mrtpo.models.tiny import build_model

    shape = ("hidden_size", "num_layers", "num_heads", "num_kv_heads")
    sizes = {k: getattr(config, k) for k in shape if hasattr(config, k)}
    model = build_model(len(tok), **sizes, max_positions=max_positions, seed=config.seed, dtype=torch.float32)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return model


def new_optimizer(model, config, *, decay_start: int | None = None):
    """``(AdamW, LambdaLR)`` of a warm start with settings ``config`` (``lr``, ``weight_decay``,
    ``warmup_steps``, ``steps``): betas (0.9, 0.98), the rate shaped by :func:`lr_factor`."""
    import torch

    opt = torch.optim.AdamW(
        model.parameters(), lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.98)
    )
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_factor(s, config.warmup_steps, config.steps, decay_start=decay_start)
    )
    return opt, sched


def sft_step(model, opt, sched, ids, mask, labels, *, loss_fn=response_loss) -> float:
    """One optimizer step on ``loss_fn`` (default :func:`response_loss`; gradient norm clipped to 1);
    returns the loss."""
    import torch

    loss = loss_fn(model, ids, mask, labels)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    return loss.item()


def save_warm_start(out_dir: str | Path, model, tok, info: dict) -> None:
    """Save ``model``, ``tok`` and ``info`` (as ``warmstart.json``) to ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "warmstart.json").write_text(json.dumps(info, indent=2))


def train_on_demonstrations(
    tok,
    config,
    prompts,
    respond,
    *,
    pick=None,
    max_positions: int,
    loss_fn=response_loss,
    evaluate=None,
    extra: dict | None = None,
):
    """Train a new model (:func:`new_model`) on demonstrations with :func:`sft_step`, seeded by
    ``config.seed`` (the torch generator forked, so the caller's is untouched).

    Each of ``config.steps`` steps draws ``config.batch_size`` rows with ``pick(rng) -> j`` (None: uniformly
    over the ``len(prompts)`` rows) and then, in that order, each row's response token ids with
    ``respond(j, rng)``; ``prompts[j]`` holds row ``j``'s prompt token ids; ``rng`` is
    ``random.Random(config.seed)``. ``evaluate(model)`` (inside the fork) returns the evaluations to record.
    Returns ``(model, info)``: the model in eval mode; ``info`` holds the settings, seconds, parameter count,
    vocabulary size, the mean loss of the last 20 steps, ``extra`` and the evaluations."""
    import random
    import time

    import torch

    t0 = time.perf_counter()
    rng = random.Random(config.seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = new_model(tok, config, max_positions=max_positions)
        opt, sched = new_optimizer(model, config)
        model.train()
        losses = []
        for _ in range(config.steps):
            rows = [pick(rng) if pick else rng.randrange(len(prompts)) for _ in range(config.batch_size)]
            responses = [respond(j, rng) for j in rows]
            ids, mask, labels = encode_pairs(tok, [prompts[j] for j in rows], responses)
            losses.append(sft_step(model, opt, sched, ids, mask, labels, loss_fn=loss_fn))
        info = {
            "config": asdict(config),
            "seconds": time.perf_counter() - t0,
            "parameters": sum(p.numel() for p in model.parameters()),
            "vocabulary": len(tok),
            **(extra or {}),
            "final_loss": sum(losses[-20:]) / len(losses[-20:]),
        }
        if evaluate is not None:
            info.update(evaluate(model))
    model.eval()
    return model, info
