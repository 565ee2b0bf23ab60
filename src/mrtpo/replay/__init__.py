"""Replay: teacher-forced passes of one response under several contexts, and the per-token distances.

docs/design.md §5. For response ``y`` (T tokens) and contexts ``C`` (full) and ``C_-k`` (leave-one-out):

    p_t = pi(. | C, y_<t),   q_t = pi(. | C_-k, y_<t)
    d[k, t] = sqrt(JSD_2(p_t, q_t))  in [0, 1]          (Jensen-Shannon distance, base-2 logs)

Token ``y_t`` is predicted from the position just before it: for a context of ``L`` tokens the
distribution of response token ``t`` (0-based) comes from sequence position ``L - 1 + t``. A context
pass therefore feeds ``context + y[:-1]`` (the last response token predicts nothing we need).

How the cost is kept down (each point is tested in the replay tests):

- the JS distance is exact over the whole vocabulary, in fp32, computed from the last hidden states
  (after the final norm) and the LM-head weight by :func:`mrtpo.credit.js_distance_from_hidden`, a
  chunk of response rows at a time: no ``[T, V]`` (let alone ``[K + 1, T, V]``) logits tensor exists;
- the decoder body is called directly, so the model never computes logits over the context;
- all contexts of a batch of responses go through the model together, right-padded (no attention mask:
  in a causal model no real token attends to the padding after it), in micro-batches bounded by a token
  budget (rows x padded length);
- the full context is not run when the caller passes the hidden states it already has from the
  rollout pass (possible when ``C`` equals the rollout prompt, i.e. there are no privileged segments);
- pairs the caller marks ``None`` (advantage ``A[j, k] = 0``) are not run, and a context identical to
  the full context gives distance 0 without a pass;
- contexts of a micro-batch (the contexts of one response, and of the responses of one prompt) share a
  token prefix (system prompt, task text, ...): with a KV cache (a plain ``DynamicCache`` of full
  attention layers) the prefix runs once and every row continues from a copy of its cache.

Precision. The forwards run in the precision of the caller's context, the precision the policy trains
in: under ``torch.autocast`` (what accelerate turns on for TRL's ``bf16`` / ``fp16``; the trainer
replays inside ``accelerator.autocast()``) the body computes in the autocast dtype, a model with
bfloat16 weights in bfloat16, FSDP2 in its mixed-precision ``param_dtype``. The vocabulary projection,
log-softmax and JS always run in float32 from the hidden states the model produced (autocast is turned
off for them), so p and q are computed alike. Against a float32 replay of the same weights, each distance
moves by at most ``2 g(delta)``, ``g(delta) = sqrt(delta (e^{2 delta} - 1) / (2 ln 2)) ~ delta /
sqrt(ln 2)``, with ``delta`` the largest logit difference of the two precisions on that token
(:func:`mrtpo.distance.js_error_bound`; tested). The model check compares the model's logits
with the float32 projection at the tolerance of the precision it computes in.

Cost unit (docs/design.md §5): 1 FPE = one no-grad forward over a response's rollout sequence
(``rollout prompt + response`` tokens). Naive replay costs ``K + 1`` FPE per response.

The model and tokenizer are duck-typed (any Hugging Face causal LM and tokenizer); this module imports
only torch, the standard library and mrtpo core modules.

The package, by section: :mod:`~mrtpo.replay.contexts` (contexts of a prompt and their cache),
:mod:`~mrtpo.replay.requests` (requests, results, stats), :mod:`~mrtpo.replay.model` (decoder body, head,
KV cache), :mod:`~mrtpo.replay.sharding` (FSDP2 / ZeRO-3), :mod:`~mrtpo.replay.measures` (JS distances and
log-probability gaps from hidden states), :mod:`~mrtpo.replay.engine` (:func:`replay`),
:mod:`~mrtpo.replay.options` (:class:`ReplayOptions`, sharding settings) and
:mod:`~mrtpo.replay.service` (:func:`for_scheme`: the replay a credit scheme asks for, and the registry
of replay kinds). Engines call :func:`for_scheme`; :func:`replay` is the engine underneath.

Notation: N responses, K contexts compared with the full one (K rewards, or 1 for joint), T response
tokens (right-padded to the longest), L context tokens, H hidden size, V vocabulary.
"""

from mrtpo.replay import gradient as _gradient  # noqa: F401  (registers the kind ``gradient``)
from mrtpo.replay.contexts import ContextCache, Contexts, build_contexts, tokenize_messages
from mrtpo.replay.engine import distances, replay, response_hidden_states, sampled_logprobs
from mrtpo.replay.measures import MEASURES, token_logprobs_from_hidden
from mrtpo.replay.options import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_PREFIX_MIN_SAVED,
    DEFAULT_TOKEN_BUDGET,
    REPLAY_FIELDS,
    SHARDING,
    SHARDING_SETTINGS,
    ReplayOptions,
)
from mrtpo.replay.requests import ReplayBatch, ReplayRequest, ReplayResult, ReplayStats
from mrtpo.replay.service import (
    REPLAY_KINDS,
    DistanceFn,
    ReplayKind,
    RolloutPass,
    for_scheme,
    register_replay,
    replay_kind,
)
from mrtpo.replay.sharding import compute_dtype, finish_body_calls, gathered

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_PREFIX_MIN_SAVED",
    "DEFAULT_TOKEN_BUDGET",
    "MEASURES",
    "REPLAY_FIELDS",
    "REPLAY_KINDS",
    "SHARDING",
    "SHARDING_SETTINGS",
    "ContextCache",
    "Contexts",
    "DistanceFn",
    "ReplayBatch",
    "ReplayKind",
    "ReplayOptions",
    "ReplayRequest",
    "ReplayResult",
    "ReplayStats",
    "RolloutPass",
    "build_contexts",
    "compute_dtype",
    "distances",
    "finish_body_calls",
    "for_scheme",
    "gathered",
    "register_replay",
    "replay",
    "replay_kind",
    "response_hidden_states",
    "sampled_logprobs",
    "token_logprobs_from_hidden",
    "tokenize_messages",
]
