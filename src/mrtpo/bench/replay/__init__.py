"""Naive replay vs :mod:`mrtpo.replay` on a random model: wall time, peak memory, FPE, difference.

Both variants replay the same N responses of one prompt under the full context ``C`` and K
leave-one-out contexts ``C_-k``, on a randomly initialised model: a small Qwen2 of the given sizes
(:func:`mrtpo.models.tiny.build_model`) or a bundled config (``config``: ``tiny``, ``qwen2.5-3b``,
``qwen2.5-7b``, :mod:`mrtpo.models.bundled`; bfloat16 on CUDA). No tokenizer: the contexts are
synthetic token blocks.

- naive (timed): what a user would write. Per response, ``K + 1`` forwards of
  ``model(context + response)`` (full logits ``[L + T, V]``), the response rows cast to float32,
  ``torch.log_softmax`` and ``torch.nn.functional.kl_div`` for ``JSD = (KL(p||m) + KL(q||m)) / 2``,
  ``d = sqrt(JSD_bits)``; the full context's log-probs ``[T, V]`` are kept while each ``C_-k`` is
  processed (never ``[K + 1, T, V]``).
- reference (not timed, after the naive measurement): the same passes' last hidden states projected
  in float64 with the float64 head weight, float64 log-softmax and JSD: the accuracy reference of both
  variants' "max |d - d_ref|".
- mrtpo (timed): :func:`mrtpo.replay.replay` (chunked JS from hidden states, float32 projection,
  prefix sharing, micro-batches). With ``reuse`` the full context's hidden states come from the
  rollout pass, as in training where the pass that computes the old log-probs produces them; that
  pass runs before the measurement. Then (timed separately, no memory figure) the same replay with each
  other ``projections`` entry (``tf32``, ``bfloat16``: :data:`mrtpo.head.PROJECTIONS`), its
  largest distance change against the float32 projection, and the documented bound
  ``2 max |z' - z| / sqrt(ln 2)`` from the largest logit change measured on the first response's rows.

Each variant runs in a fresh subprocess (``python -m mrtpo.bench.replay --worker ...``) so that its
peak memory is its own: on CPU the growth of the process's peak RSS over the variant (free heap memory
handed back with glibc's ``malloc_trim(0)``, then ``VmHWM`` reset to the current RSS through
``/proc/self/clear_refs``, so memory freed before the variant cannot hide part of its peak); on CUDA
``torch.cuda.max_memory_allocated`` growth.

Synthetic prompt layout (token blocks drawn uniformly from the vocabulary)::

    C    = shared (prompt_tokens) + info_1 + ... + info_K (info_tokens each) + generation prompt (3)
    C_-k = C without info_k;   the rollout prompt is C (no privileged segments)
"""

from mrtpo.bench.replay.config import GEN_PROMPT_TOKENS, BenchConfig
from mrtpo.bench.replay.driver import BenchResult, run_bench, run_variant
from mrtpo.bench.replay.variants import (
    PeakMemory,
    build_bench_model,
    design_memory,
    forward_limit,
    fpe_seconds,
    logit_error,
    make_data,
    naive_replay,
    reference_replay,
    vocab_work,
)

__all__ = [
    "GEN_PROMPT_TOKENS",
    "BenchConfig",
    "BenchResult",
    "PeakMemory",
    "build_bench_model",
    "design_memory",
    "forward_limit",
    "fpe_seconds",
    "logit_error",
    "make_data",
    "naive_replay",
    "reference_replay",
    "run_bench",
    "run_variant",
    "vocab_work",
]
