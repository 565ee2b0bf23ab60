"""Replay on a verl ``DataProto`` in the calling process: :func:`replay_distances` and the
:data:`DistancesFor` of :func:`make_distances_for`."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from mrtpo import replay as replay_mod
from mrtpo.integrations.verl.reward import _extra_infos, example_from_extra_info, task_from_extra_info

logger = logging.getLogger(__name__)

DistancesFor = Callable[[Any], replay_mod.DistanceFn]
"""``distances_for(data) -> DistanceFn``: the replay of one verl batch (a ``DataProto``), as the core's
:data:`mrtpo.replay.DistanceFn` ``(kind, advantages [N, K]) -> ReplayResult`` (distances [N, K', T] and
the rows replayed; kind: the credit scheme's replay kind, :data:`mrtpo.replay.REPLAY_KINDS`)."""


def _response_ids(batch: Mapping[str, Any]) -> tuple[list[list[int]], int]:
    """Valid response ids of each row and the padded response width T.

    verl's layout: ``prompts`` (bs, P) left-padded, ``responses`` (bs, T) right-padded and
    ``attention_mask`` (bs, P + T); the valid response length is ``attention_mask[:, P:].sum()``.
    """
    responses = batch["responses"]  # [N, T]
    t = responses.shape[1]
    if "attention_mask" in batch and "prompts" in batch:
        p = batch["prompts"].shape[1]
        lengths = batch["attention_mask"][:, p:].sum(1)  # [N]
    else:
        lengths = (batch["response_mask"] != 0).sum(1)
    ids = responses.detach().cpu()
    return [ids[j, : int(lengths[j])].tolist() for j in range(ids.shape[0])], t


def replay_distances(
    model: Any,
    tokenizer: Any,
    data: Any,
    *,
    kind: str,
    reward_names: Sequence[str] | None = None,
    advantages: Tensor | None = None,
    options: replay_mod.ReplayOptions | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    temperature: float = 1.0,
    progress: bool = False,
    credit_options: Mapping[str, Any] | None = None,
) -> replay_mod.ReplayResult:
    """The replay kind ``kind`` of a DataProto's responses through :func:`mrtpo.replay.for_scheme`:
    ``[N, K', T]`` (K' = K for a per-reward kind, 1 for a shared-row kind), T the batch's response width,
    and which rows ran.

    Contexts come from the examples in ``non_tensor_batch["extra_info"]`` (tokenized with ``tokenizer``'s
    chat template and ``template_kwargs``, which must match verl's ``data.apply_chat_template_kwargs``);
    responses are ``batch["responses"][j, :L_j]`` with ``L_j`` valid tokens (``attention_mask``). Which
    pairs run is the kind's rule (:mod:`mrtpo.replay.service`). Every pass runs here (verl's
    ``old_log_probs`` are not read). A response whose rollout prompt, rebuilt from the segments, differs
    from verl's ``prompts`` row is still replayed; a warning names how many differ.

    Args:
        model: a Hugging Face causal LM (the policy that sampled, e.g. the actor before its update).
        tokenizer: its tokenizer (``pad_token_id`` pads replay micro-batches).
        data: verl ``DataProto`` (``batch`` with ``responses``, ``prompts``, ``attention_mask``).
        kind: a replay kind (:data:`mrtpo.replay.REPLAY_KINDS`), the credit scheme's ``replay``.
        reward_names: the K reward names in column order (None: the task's ``reward_names``).
        advantages: [N, K] response-level advantages (skipping), or None (every pair runs).
        options: :class:`mrtpo.replay.ReplayOptions` (its ``sharding`` is collective when not "none":
            every rank calls, also with zero rows).
        template_kwargs: chat-template kwargs of the contexts.
        temperature: the sampling temperature of the log-probability kinds (verl's
            ``actor_rollout_ref.rollout.temperature``).
        progress: tqdm bar over replay micro-batches.
        credit_options: the credit scheme's options (``algorithm.mrtpo.credit_options``), read by a kind
            that completes its answer from the batch (``gradient``: P2T's τ, segments and scalar).

    A kind that reads the batch beyond its contexts (``gradient``, credit ``p2t``) gets it here as it gets
    it on the TRL path (:class:`mrtpo.replay.ReplayBatch`): the examples, the verifiers of each example's
    task (built from ``extra_info`` in this process: a model reward's scorer is loaded where replay runs,
    on verl's actor worker its GPU) and ``tokenizer`` (the response tokens' character ranges).

    Returns:
        :class:`mrtpo.replay.ReplayResult` with ``distances: [N, K', T] float32`` on the CPU, ``replayed``
        [N, K'] and ``attributed`` [N, K'] (rows holding P2T's weights; all False for other kinds).
    """
    batch, ntb = data.batch, data.non_tensor_batch
    infos = _extra_infos(ntb, "replay_distances")
    examples = [example_from_extra_info(info) for info in infos]
    names = (
        list(reward_names) if reward_names is not None else list(task_from_extra_info(infos[0]).reward_names)
    )
    responses, t = _response_ids(batch)
    n = len(responses)
    if len(examples) != n:
        raise ValueError(f"non_tensor_batch['extra_info'] has {len(examples)} rows; expected N={n}")
    contexts = replay_mod.ContextCache(tokenizer, names, template_kwargs)([ex.segments for ex in examples])
    if "prompts" in batch and "attention_mask" in batch:
        prompts = batch["prompts"].detach().cpu()
        pmask = batch["attention_mask"][:, : prompts.shape[1]].detach().cpu().bool()
        differ = sum(tuple(prompts[j][pmask[j]].tolist()) != contexts[j].rollout for j in range(n))
        if differ:
            logger.warning(
                "replay: %d of %d rollout prompts rebuilt from the segments differ from verl's prompt ids "
                "(chat template kwargs?); distances use the rebuilt contexts",
                differ,
                n,
            )
    pad = getattr(tokenizer, "pad_token_id", None)
    extra = None
    if replay_mod.replay_kind(kind).answer is not None:
        verifiers = [task_from_extra_info(info).verifiers(ex) for info, ex in zip(infos, examples)]
        extra = replay_mod.ReplayBatch(examples, verifiers, tokenizer, dict(credit_options or {}))
    res = replay_mod.for_scheme(
        model,
        contexts,
        responses,
        advantages,
        kind,
        width=t,
        options=options,
        temperature=temperature,
        pad_id=0 if pad is None else int(pad),
        progress=progress,
        batch=extra,
    )
    replayed = res.replayed.cpu()
    attributed = (
        torch.zeros_like(replayed) if res.attributed is None else res.attributed.cpu()
    )  # [N, K'] bool
    return replay_mod.ReplayResult(res.distances.cpu(), res.lengths, res.stats, replayed, attributed)


def batch_temperature(data: Any, default: float = 1.0) -> float:
    """The sampling temperature verl's trainer puts in ``data.meta_info["temperature"]``, else ``default``."""
    meta = getattr(data, "meta_info", None)
    value = meta.get("temperature") if isinstance(meta, dict) else None
    return default if value is None else float(value)


def make_distances_for(
    model: Any,
    tokenizer: Any,
    *,
    options: replay_mod.ReplayOptions | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    temperature: float | None = None,
    progress: bool = False,
    credit_options: Mapping[str, Any] | None = None,
) -> DistancesFor:
    """A :data:`DistancesFor` for :func:`install` that replays with ``model`` in the calling process.

    The log-probability kinds (CoRT, RLSD) run at ``temperature`` if given, else at the batch's
    ``meta_info["temperature"]`` (verl's trainer sets it to ``actor_rollout_ref.rollout.temperature``),
    else 1. ``credit_options``: the credit scheme's options (P2T's, for the kind ``gradient``). The replay
    stats of the last call are in ``data.meta_info["mrtpo/replay"]``.
    """

    def distances_for(data: Any) -> replay_mod.DistanceFn:
        tau = temperature if temperature is not None else batch_temperature(data)

        def distances(kind: str, advantages: Tensor) -> replay_mod.ReplayResult:
            res = replay_distances(
                model, tokenizer, data, kind=kind, advantages=advantages, options=options,
                template_kwargs=template_kwargs, temperature=tau, progress=progress,
                credit_options=credit_options,
            )  # fmt: skip
            meta = getattr(data, "meta_info", None)
            if isinstance(meta, dict):
                meta["mrtpo/replay"] = res.stats.as_dict()
            return res

        return distances

    return distances_for
