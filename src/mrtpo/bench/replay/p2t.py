"""The ``p2t`` variant of the replay bench: P2T's gradient attribution at the shapes of the replay.

One model reward per response, scored by a reward model of the policy's shapes (the same config with a
one-logit classification head: :func:`mrtpo.models.tiny.build_classifier`, or the bundled config's body),
reading the rollout sequence of the replay (the full context ``C`` and the response: 1 FPE of tokens).
Timed, as the trainer runs it (:meth:`mrtpo.tasks.model_reward.ModelReward.attribute`): the N sequences
left-padded in one batch, the embeddings looked up, one gradient-tracked forward of the verdict's log-odds
and one backward to the embeddings (:func:`mrtpo.attribution.attribute`), then ``w = T · softmax(I)``
over each response's tokens (:func:`mrtpo.attribution.influence_weights`). Memory as the other variants:
peak RSS growth (CUDA: allocator peak) around the timed run, and the tracked peak of live tensors in a
second, untimed run. The FPE time is the same scorer body's no-grad forward over one rollout sequence.
"""

from __future__ import annotations

import time
from typing import Any

from mrtpo.bench.replay.config import BenchConfig


def build_scorer(cfg: BenchConfig):
    """A random one-logit sequence classifier with the bench model's shapes, on ``cfg.device``."""
    import torch

    dtype = torch.bfloat16 if cfg.dtype == "bfloat16" else torch.float32
    if cfg.config is not None:
        from mrtpo.models.bundled import build_bundled

        return build_bundled(cfg.config, device=cfg.device, dtype=dtype, seed=cfg.seed, classifier=True)
    from mrtpo.models.tiny import build_classifier

    return build_classifier(cfg.vocab, hidden_size=cfg.hidden, num_layers=cfg.layers, seed=cfg.seed).to(
        device=cfg.device, dtype=dtype
    )


def _attribute(scorer, seqs: list[list[int]], t: int):
    """One batch as ModelReward.attribute runs it: ``(weights [N, T], AttributionStats)``."""
    import torch

    from mrtpo.attribution import AttributionStats, attribute, influence_weights, log_odds

    dev = next(scorer.parameters()).device
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long, device=dev)
    mask = torch.zeros(len(seqs), width, dtype=torch.long, device=dev)
    for j, s in enumerate(seqs):
        ids[j, width - len(s) :] = torch.tensor(s, device=dev)
        mask[j, width - len(s) :] = 1
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    emb = scorer.get_input_embeddings()
    stats = AttributionStats()
    with torch.no_grad():
        x = emb(ids)
    _, infl = attribute(
        lambda e: log_odds(scorer(inputs_embeds=e, attention_mask=mask, position_ids=pos).logits),
        x,
        emb.weight[0],
        stats=stats,
        tokens=int(mask.sum()),
    )
    w = influence_weights(infl[:, -t:], torch.ones(len(seqs), t, dtype=torch.bool, device=infl.device))
    return w, stats


def run_p2t(cfg: BenchConfig) -> tuple[dict[str, Any], Any]:
    """The ``p2t`` variant's figures and its weights ``[N, 1, T]``."""
    import torch

    from mrtpo.bench.memory import TrackedPeak
    from mrtpo.bench.replay.variants import PeakMemory, _sync, fpe_seconds, make_data

    torch.set_num_threads(cfg.threads)
    scorer = build_scorer(cfg)
    scorer.requires_grad_(False)  # frozen: the gradient goes to the embeddings only
    full, _, responses = make_data(cfg)
    seqs = [full + r for r in responses]
    _attribute(scorer, [s[:16] for s in seqs], 8)  # warm-up, outside the measure
    with PeakMemory(cfg.device) as mem:
        t0 = time.perf_counter()
        w, stats = _attribute(scorer, seqs, cfg.t)
        _sync(cfg.device)
        seconds = time.perf_counter() - t0
    if cfg.device == "cuda":
        tracked: Any = mem
    else:
        with TrackedPeak(cfg.device) as tracked:
            _attribute(scorer, seqs, cfg.t)
    fpe = fpe_seconds(scorer, full, responses[0], cfg.device)
    out = {
        "variant": "p2t",
        "seconds": seconds,
        "peak_bytes": tracked.peak,
        "memory_method": tracked.method,
        "rss_peak_bytes": mem.peak,
        "rss_method": mem.method,
        "fpe_seconds": fpe,
        "fpe_per_response": seconds / max(fpe, 1e-12) / cfg.responses,
        **stats.as_dict(),
    }
    return out, w[:, None, :].float().cpu()


def p2t_lines(p2t: dict[str, Any], mrtpo: dict[str, Any], cfg: BenchConfig) -> list[str]:
    """The table's p2t section: its time, memory and cost beside replay's, per (response, reward) pair."""
    mib = 1024 * 1024
    pairs = max(mrtpo.get("pairs_run", 0), 1)
    replay_pair = mrtpo["seconds"] / pairs
    p2t_pair = p2t["seconds"] / max(p2t["sequences"], 1)
    return [
        "",
        f"p2t (replay kind gradient): one model reward per response, a one-logit classifier of the policy's shapes "
        f"reading C + the response ({cfg.context_tokens + cfg.t} tokens), {cfg.responses} sequences in one batch:",
        f"  wall time {p2t['seconds']:.3f} s = {p2t['fpe_per_response']:.2f} FPE per response (1 FPE = "
        f"{p2t['fpe_seconds'] * 1e3:.1f} ms, the scorer's no-grad forward); {p2t['forwards']} forward with "
        f"gradient, {p2t['backwards']} backward to the embeddings, {p2t['tokens']} tokens",
        f"  peak memory {p2t['peak_bytes'] / mib:.1f} MiB ({p2t['memory_method']}); RSS growth "
        f"{p2t['rss_peak_bytes'] / mib:.1f} MiB; replay (mrtpo) {mrtpo['peak_bytes'] / mib:.1f} MiB",
        f"  per (response, reward) pair: p2t {p2t_pair:.3f} s, replay (mrtpo, {pairs} pairs run in "
        f"{mrtpo['seconds']:.3f} s) {replay_pair:.3f} s: p2t / replay = {p2t_pair / max(replay_pair, 1e-12):.2f}x",
    ]
