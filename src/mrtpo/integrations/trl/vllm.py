"""What :class:`~mrtpo.integrations.trl.trainer.MRTPOTrainer` does on TRL's vLLM path (``use_vllm=True``,
``vllm_mode`` ``colocate`` or ``server``; docs/scale.md, "Generation with vLLM").

TRL generates with vLLM (weights pushed to the engine before each generation at a new optimizer step),
takes vLLM's log-probabilities of the sampled tokens (``sampling_per_token_logps``, after temperature and
the sampling filters: ``logprobs_mode="processed_logprobs"``), always runs its own old-log-probability
pass with the training model when ``vllm_importance_sampling_correction`` is on (the default), and
computes the importance-sampling ratio ``pi_old / pi_vllm`` per token or per sequence, truncated or
masked (``vllm_importance_sampling_mode``, ``_clip_min`` / ``_clip_max``). Its loss multiplies that ratio
into every token's term. mrtpo composes with it as follows:

- **Token advantages.** The loss of token t of response j is TRL's clipped surrogate on the token
  advantage ``S[j, t]`` (``[B, T]``, :attr:`MRTPOTrainer.last_batch` ``["token_advantages"]``) times the
  ratio: ``-min(c S, clip(c, 1 - eps, 1 + eps_high) S) * w`` with ``c = pi_theta / pi_old`` and ``w``
  TRL's ratio, aggregated by TRL's ``loss_type``. Nothing of TRL's correction is replaced.
- **Replay reuses the rollout pass.** The old-log-probability pass TRL runs for the correction is the
  training model on the rollout prompt; its last hidden states are captured and stand in for the full
  context ``C`` where ``C`` is the rollout prompt (as without vLLM, when TRL runs that pass).
- **Which "policy as it sampled".** Wherever mrtpo compares the policy with itself (RLSD's teacher vs
  student gap, CoRT's relevance, MRTPO's distances) both sides are passes of the training model with
  the weights vLLM sampled with, never vLLM's log-probabilities: the gap must measure the information a
  context adds, not the numerical difference between two engines (bf16 kernels, another attention
  implementation). That difference is what TRL's ratio corrects, once, in the loss.
- **OPSD.** The divergence of each sampled token is weighted by the same ratio (:func:`weight_tokens`).
- **Memory.** Replay runs in ``_generate_and_score_completions``, after vLLM has generated: a colocated
  engine without sleep mode still holds its share (``vllm_gpu_memory_utilization`` of the GPU: weights
  and KV cache) while replay runs; with ``vllm_enable_sleep_mode`` it has freed both (level 2).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

ENGINE_FIELDS = {
    "sampling_logps": "sampling_per_token_logps",
    "importance_sampling_ratio": "importance_sampling_ratio",
}
"""``last_batch`` key -> the key of TRL's batch it comes from."""


def engine_sampling(out: Mapping[str, Any]) -> dict[str, torch.Tensor | None]:
    """What TRL's vLLM path adds to a batch, detached on CPU (None without vLLM or without the
    correction): the engine's log-probabilities of the sampled tokens ``[B, T]`` and TRL's
    importance-sampling ratio (``[B, T]`` for the ``token_*`` modes, ``[B, 1]`` for ``sequence_*``)."""
    return {k: out[v].detach().cpu() if out.get(v) is not None else None for k, v in ENGINE_FIELDS.items()}


def weight_tokens(per_token: torch.Tensor, inputs: Mapping[str, Any]) -> torch.Tensor:
    """``per_token`` ``[B, T]`` times TRL's importance-sampling ratio of the micro-batch where TRL
    computed one (vLLM with ``vllm_importance_sampling_correction``), as TRL weights its own per-token
    losses; unchanged otherwise."""
    ratio = inputs.get("importance_sampling_ratio")
    return per_token if ratio is None else per_token * ratio
