"""Memory per GPU of a :class:`~mrtpo.plan.setup.Setup`, by part and by phase, in bytes.

Each term says how it is computed (``formula``) and how far it is from a measurement (``error``; see
:mod:`mrtpo.plan.validate` for the measurements and ``ERRORS`` for the figures printed). Notation: P
parameters, L_max the largest module's own parameters (the embedding), n training processes, V
vocabulary, H hidden size, q / kv the query / key-value widths, I the MLP width, layers the decoder
layers, s the padded sequence (``prompt_max + max_completion``), b the micro-batch.

- **Model states under ZeRO-3** are DeepSpeed's own estimate,
  ``deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs`` (no offload: ``18 P / n + 4
  L_max`` bytes; optimizer offload: ``2 P / n + 4 L_max``; all offloaded: ``4 L_max``), split as
  weights ``2 P/n + 2 L_max`` (bf16 partition, one gathered module), gradients ``4 P/n + 2 L_max`` (the
  estimator's gradient share) and optimizer the rest (fp32 master and Adam's two moments, ``12 P/n``).
  LoRA under ZeRO-3: the frozen base ``2 P/n + 2 L_max`` plus the adapters at 16 bytes each, over n.
- **FSDP2** (accelerate, bf16 mixed precision: accelerate upcasts trainable parameters to fp32):
  ``4 P/n`` fp32 parameters + the unsharded bf16 root unit (embeddings, head, final norm) + two decoder
  layers in flight (``2 x 2`` bytes each) as weights; ``4 P/n`` + two layers' bf16 gradients; ``8 P/n``
  Adam moments.
- **DDP**: weights, gradients and Adam's two moments in the model's dtype (``d P``, ``d P``, ``2 d P``).
- **Activations** of one training micro-batch (bf16 compute, fp32 RMSNorm inputs as transformers keeps
  them, flash/SDPA attention without an s x s matrix): per token and decoder layer ``12 H + 8 q + 8 kv
  + 8 I`` bytes (``+ 6 (q + kv)`` for Qwen3's q/k norms), plus ``6 H`` for the final norm; with gradient checkpointing only each layer's input
  (``2 H``) is kept and one layer is recomputed at a time. TRL 1.16's fused log-prob head adds, in the
  backward, an fp32 ``[V, H]`` gradient accumulator and its bf16 result (``6 V H``), an fp32 ``[b x
  completion, H]`` hidden gradient and a bf16 ``[min(b x completion, 4096), 32768]`` tile.
- **Generation**: a colocated vLLM engine takes ``vllm_gpu_memory_utilization x`` the GPU's memory; its KV
  cache (``2 x layers x kv x 2`` bytes per token) is what is left after the terms vLLM's own memory
  profile subtracts (:func:`vllm_non_kv`): the weights (``2 P``), the peak activations of its profile run
  (TRL's ``max_num_batched_tokens = 4096`` tokens through a layer: ``4096 x (3 I + 2 (q + 2 kv) + 4 H) x
  2`` bytes), the sampler's fp32 logits and log-probs of ``max_num_seqs`` rows (TRL: the process's
  generation batch; ``2 x rows x V x 4``), CUDA graphs (assumed 0.5 GiB) and memory outside torch's
  allocator (assumed 0.25 GiB). A vLLM server (``vllm_mode: server``) holds its engine on its own GPU at
  ``trl vllm-serve``'s default utilization 0.9. transformers' generate holds the gathered model (sharded
  engines) and a KV cache of the process's generation batch at full length.
- **Reference model** (``beta > 0``): TRL's second copy of the model in bf16, sharded as the policy is
  (ZeRO-3: ``2 P/n + 2 L_max``; FSDP2: ``2 P/n``; DDP: ``2 P``).
- **Replay**: ``gather`` holds the gathered model (``2 P (1 - 1/n)``), ``lockstep`` only the gathered head
  (``2 V H``); both hold an fp32 copy of the head (``4 V H``, none for a bfloat16 projection), the
  ``[chunk, V]`` fp32 blocks of the distance kernel (2 fused, 5 eager), the micro-batch's no-grad
  forward (``token_budget x 2 (5 H + 3 I)``), the copies of a shared prefix's KV cache per row, and, when
  the rollout pass's hidden states are reused (no privileged segment), those states (``rows x completion
  x 2 H``). ``auto`` gathers when ``2 P (1 - 1/n) + 4 V H`` is at most 80 % of the memory free then
  (:data:`mrtpo.integrations.trl.sharding.GATHER_MARGIN`), as the trainer decides.
- **Overhead**: 1.5 GiB per GPU for the CUDA context and NCCL buffers, plus 5 % of the phase's other
  bytes for the allocator's fragmentation (both assumptions, not measured here).

Phases: generation (model states + the engine), replay (model states + the engine unless it sleeps +
replay), training (model states + the engine unless it sleeps + activations); the reference model in every
phase. The total is the largest.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io

from mrtpo.plan.setup import Setup
from mrtpo.plan.shapes import Shape

GIB = 2**30
OVERHEAD = int(1.5 * GIB)  # CUDA context and NCCL buffers (assumed)
FRAGMENTATION = 0.05  # the allocator's fragmentation, a share of the phase's bytes (assumed)
VLLM_CUDA_GRAPHS = GIB // 2  # vLLM's captured CUDA graphs (assumed)
VLLM_NON_TORCH = GIB // 4  # vLLM's memory outside torch's allocator (assumed)
VLLM_BATCHED_TOKENS = 4096  # TRL 1.16's max_num_batched_tokens for a colocated engine
SERVER_UTILIZATION = 0.9  # trl vllm-serve's default --gpu_memory_utilization
GATHER_MARGIN = 0.8  # mrtpo.integrations.trl.sharding.GATHER_MARGIN (a test checks they agree)
FUSED_TILE = (4096, 32768)  # TRL's fused log-prob head: a [min(tokens, 4096), 32768] bf16 tile
LORA_SHAPES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass
class Memory:
    """Bytes per GPU by part (each part's largest value over the phases) and by phase."""

    parts: dict[str, int]
    phases: dict[str, int]
    formulas: dict[str, str]
    deepspeed: int | None  # DeepSpeed's estimate of the model states (ZeRO-3), bytes
    replay_mode: str  # the replay sharding the plan assumes (auto resolved)
    kv_tokens: int  # tokens the generation's KV cache holds (per process)
    kv_needed: int  # tokens the process's generation batch needs at full length

    @property
    def total(self) -> int:
        return max(self.phases.values())

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phases.get)


def deepspeed_zero3(params: int, largest: int, processes: int, nodes: int, offload: str) -> int:
    """DeepSpeed's ``estimate_zero3_model_states_mem_needs`` GPU figure (bytes per GPU; ``zero_init``)."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    _cpu, gpu, _largest = estimate_zero3_model_states_mem_needs(
        total_params=params,
        largest_layer_params=largest,
        num_gpus_per_node=max(1, processes // max(1, nodes)),
        num_nodes=nodes,
        cpu_offload=offload in ("optimizer", "all"),
        cpu_offload_params=offload == "all",
        zero_init=True,
    )
    return int(gpu)


def lora_params(s: Setup) -> int:
    """Adapter parameters of the recipe's ``peft`` section: ``r (in + out)`` per targeted projection and
    layer, plus full copies of ``modules_to_save`` (the head)."""
    sh = s.shape
    r = int((s.lora or {}).get("r", 8))
    dims = {
        "q_proj": (sh.hidden, sh.q_dim), "k_proj": (sh.hidden, sh.kv_dim), "v_proj": (sh.hidden, sh.kv_dim),
        "o_proj": (sh.q_dim, sh.hidden), "gate_proj": (sh.hidden, sh.intermediate),
        "up_proj": (sh.hidden, sh.intermediate), "down_proj": (sh.intermediate, sh.hidden),
    }  # fmt: skip
    targets = (s.lora or {}).get("target_modules") or ["q_proj", "v_proj"]
    if targets == "all-linear":
        targets = list(LORA_SHAPES)
    per_layer = sum(r * (dims[t][0] + dims[t][1]) for t in targets if t in dims)
    saved = (s.lora or {}).get("modules_to_save") or []
    return sh.layers * per_layer + (sh.head_params() if "lm_head" in saved else 0)


def model_states(s: Setup) -> tuple[dict[str, int], dict[str, str], int | None]:
    """(weights, gradients, optimizer) bytes per GPU, their formulas, DeepSpeed's figure (ZeRO-3)."""
    sh = s.shape
    p, lmax, n = sh.params(), sh.largest_module_params(), s.processes
    if s.sharding == "zero3":
        if s.lora:
            a = lora_params(s)
            w, g, o = 2 * p // n + 2 * lmax, 4 * a // n, 12 * a // n
            return ({"weights": w, "gradients": g, "optimizer": o},
                    {"weights": "frozen base 2 P/n + 2 L_max", "gradients": "adapters 4 A/n",
                     "optimizer": "adapters 12 A/n"}, None)  # fmt: skip
        ds = deepspeed_zero3(p, lmax, n, s.nodes, s.offload)
        if s.offload == "none":
            w, g = 2 * p // n + 2 * lmax, 4 * p // n + 2 * lmax
        elif s.offload == "optimizer":
            w, g = 2 * p // n + 2 * lmax, 2 * lmax
        else:
            w, g = 2 * lmax, 2 * lmax
        f = {"weights": "DeepSpeed ZeRO-3: 2 P/n + 2 L_max", "gradients": "DeepSpeed ZeRO-3: 4 P/n + 2 L_max",
             "optimizer": "DeepSpeed ZeRO-3: 12 P/n (fp32 master, Adam)"}  # fmt: skip
        if s.offload != "none":
            f = {k: f"DeepSpeed ZeRO-3, offload {s.offload}" for k in f}
        return {"weights": w, "gradients": g, "optimizer": ds - w - g}, f, ds
    if s.offload != "none":
        raise ValueError(f"--offload {s.offload} is planned for DeepSpeed ZeRO-3 only (--sharding zero3)")
    if s.sharding == "fsdp2":
        root = sh.head_params() * (1 if sh.tied else 2) + sh.hidden
        layer = sh.layer_params()
        return (
            {"weights": 4 * p // n + 2 * root + 4 * layer, "gradients": 4 * p // n + 4 * layer, "optimizer": 8 * p // n},
            {"weights": "FSDP2: 4 P/n + bf16 root unit + 2 layers", "gradients": "FSDP2: 4 P/n + 2 layers' bf16",
             "optimizer": "FSDP2: Adam 8 P/n"},
            None,
        )  # fmt: skip
    d = s.weights_dtype_bytes
    trainable = lora_params(s) if s.lora else p
    return (
        {"weights": d * p, "gradients": d * trainable, "optimizer": 2 * d * trainable},
        {"weights": f"DDP: {d} P", "gradients": f"DDP: {d} x trainable", "optimizer": f"DDP: Adam {2 * d} x trainable"},
        None,
    )  # fmt: skip


def layer_activation_bytes(sh: Shape) -> int:
    """Bytes autograd keeps per token for one decoder layer (bf16 compute, fp32 norm inputs; Qwen3's q/k
    norms keep their fp32 inputs and bf16 outputs too)."""
    extra = 6 * (sh.q_dim + sh.kv_dim) if sh.qk_norm else 0
    return 12 * sh.hidden + 8 * sh.q_dim + 8 * sh.kv_dim + 8 * sh.intermediate + extra


def saved_activation_bytes(sh: Shape, tokens: int, checkpointing: bool) -> int:
    """Bytes autograd holds after the forward of ``tokens`` tokens through the decoder (no head):
    every layer's tensors, or with gradient checkpointing each layer's bf16 input; plus the final norm."""
    per_token = sh.layers * (2 * sh.hidden if checkpointing else layer_activation_bytes(sh)) + 6 * sh.hidden
    return tokens * per_token


def activations(s: Setup, micro_batch: int | None = None, checkpointing: bool | None = None) -> int:
    """One training micro-batch at full length: the saved activations, the layer recomputed in the
    backward under checkpointing, and TRL's fused head's backward buffers."""
    sh = s.shape
    b = s.micro_batch if micro_batch is None else micro_batch
    ckpt = s.checkpointing if checkpointing is None else checkpointing
    tokens = b * (s.prompt_max + s.max_completion)
    kept = saved_activation_bytes(sh, tokens, ckpt) + (tokens * layer_activation_bytes(sh) if ckpt else 0)
    scored = b * s.max_completion  # completion tokens the fused head scores
    head = 6 * sh.head_params() + 4 * scored * sh.hidden + min(scored, FUSED_TILE[0]) * FUSED_TILE[1] * 2
    return kept + head


def vllm_non_kv(s: Setup, rows: int | None = None) -> dict[str, int]:
    """What vLLM's memory profile subtracts from its share before the KV cache, by term (bytes)."""
    sh = s.shape
    rows = s.rows_per_process if rows is None else rows
    act = VLLM_BATCHED_TOKENS * (3 * sh.intermediate + 2 * (sh.q_dim + 2 * sh.kv_dim) + 4 * sh.hidden) * 2
    return {"weights": 2 * sh.params(), "profile activations": act, "sampler": 2 * rows * sh.vocab * 4,
            "CUDA graphs (assumed)": VLLM_CUDA_GRAPHS, "non-torch (assumed)": VLLM_NON_TORCH}  # fmt: skip


def generation(s: Setup) -> tuple[int, int, int]:
    """(bytes on a training GPU, KV tokens the engine holds, KV tokens the process's generation batch needs
    at full length). A server's KV cache is on its own GPU (its tokens are returned, its bytes are not)."""
    sh = s.shape
    kv_tok = sh.kv_bytes_per_token(2)
    rows = s.rows_per_process
    needed = rows * (s.prompt_max + s.max_completion)
    if s.vllm == "colocate":
        share = int(s.vllm_share * s.gpu_memory_gib * GIB)
        kv = share - sum(vllm_non_kv(s).values())
        return share, max(0, kv) // kv_tok, needed
    if s.vllm == "server":
        share = int(SERVER_UTILIZATION * s.gpu_memory_gib * GIB)
        kv = share - sum(vllm_non_kv(s, s.responses_per_step).values())
        return 0, max(0, kv) // kv_tok, s.responses_per_step * (s.prompt_max + s.max_completion)
    gathered = 2 * sh.params() * (s.processes - 1) // s.processes if s.sharding in ("zero3", "fsdp2") else 0
    return gathered + needed * kv_tok, needed, needed


def distance_blocks_bytes(kernel: str, chunk: int, vocab: int) -> int:
    """The ``[chunk, V]`` float32 blocks a distance kernel holds at once: 5 for the eager kernel, 2 for the
    fused one (``C``'s block and one ``C_-k``'s), as docs/replay-kernels.md measures them."""
    return (5 if kernel == "eager" else 2) * chunk * vocab * 4


def replay_bytes(s: Setup, mode: str) -> int:
    sh = s.shape
    if not s.replays:
        return 0
    n = s.processes
    sharded = s.sharding in ("zero3", "fsdp2")
    out = 0
    if sharded and mode == "gather":
        out += 2 * sh.params() * (n - 1) // n
    elif sharded:
        out += 2 * sh.head_params()
    if s.replay_projection != "bfloat16":
        out += 4 * sh.head_params()
    out += distance_blocks_bytes(s.replay_kernel, s.replay_chunk, sh.vocab)
    budget = s.replay_token_budget or s.rows_per_process * (s.prompt_max + s.max_completion)
    out += budget * 2 * (5 * sh.hidden + 3 * sh.intermediate)
    if s.replay_prefix_sharing:
        rows = max(1, budget // max(1, s.rollout_tokens + s.response_tokens))
        out += rows * s.profile.shared_prefix * sh.kv_bytes_per_token(2)
    if s.profile.privileged_tokens == 0:  # C is the rollout prompt: its hidden states are reused
        out += s.rows_per_process * s.max_completion * 2 * sh.hidden
    return out


def overhead(phase_bytes: int) -> int:
    """The CUDA context and NCCL buffers plus the allocator's fragmentation of a phase (assumed)."""
    return OVERHEAD + int(FRAGMENTATION * phase_bytes)


def reference_bytes(s: Setup) -> int:
    """TRL's reference model (``beta > 0``; none with LoRA: the base with the adapter off is the reference)."""
    if s.beta <= 0 or s.lora:
        return 0
    sh = s.shape
    p = sh.params()
    if s.sharding == "zero3":
        return 2 * p // s.processes + 2 * sh.largest_module_params()
    if s.sharding == "fsdp2":
        return 2 * p // s.processes
    return s.weights_dtype_bytes * p


def scorer_bytes(s: Setup) -> tuple[int, int]:
    """The model rewards' scorers on every process: ``(weights, attribution)`` bytes. Each scorer loads whole
    on each process (bf16), beside the policy; a kind that attributes (:attr:`ReplayKind.scorer_passes`) adds,
    in the replay phase, the largest scorer's activations of one attribution call
    (:func:`mrtpo.attribution.attribution_activation_bytes`, over the longest prompt and completion)."""
    if not s.scorers:
        return 0, 0
    from mrtpo.attribution import attribution_activation_bytes

    weights = sum(2 * sh.params() for sh, _, _ in s.scorers)
    kind = s.replay_kind
    if kind is None or not kind.scorer_passes:
        return weights, 0
    tokens = s.prompt_max + s.max_completion
    act = max(
        attribution_activation_bytes(layers=sh.layers, hidden=sh.hidden, intermediate=sh.intermediate,
                                     tokens=tokens, batch=batch, checkpointing=ckpt)
        for sh, batch, ckpt in s.scorers
    )  # fmt: skip
    return weights, act


def memory(s: Setup, replay_sharding: str | None = None, micro_batch: int | None = None,
           checkpointing: bool | None = None) -> Memory:  # fmt: skip
    states, formulas, ds = model_states(s)
    ref = reference_bytes(s)
    scorer_weights, attribution = scorer_bytes(s)
    base = sum(states.values()) + ref + scorer_weights
    gen, kv_tokens, kv_needed = generation(s)
    engine_resident = gen if (s.vllm == "colocate" and not s.vllm_sleeps) else 0
    mode = replay_sharding or s.replay_sharding
    if mode == "auto":
        sh = s.shape
        if s.sharding not in ("zero3", "fsdp2") or s.processes == 1:
            mode = "none"
        else:
            need = 2 * sh.params() * (s.processes - 1) // s.processes + 4 * sh.head_params()
            free = s.gpu_memory_gib * GIB - base - engine_resident - OVERHEAD
            mode = "gather" if need <= GATHER_MARGIN * free else "lockstep"
    act = activations(s, micro_batch, checkpointing)
    rep = replay_bytes(s, mode)
    raw = {"generation": base + gen, "training": base + engine_resident + act}
    if s.replays:
        raw["replay"] = base + engine_resident + max(rep, attribution)  # replay's forwards, then the scorer's
    phases = {k: overhead(v) + v for k, v in raw.items()}
    parts = {**states, "reference": ref, "activations": act, "generation": gen, "replay": rep,
             "overhead": max(overhead(v) for v in raw.values())}  # fmt: skip
    if s.scorers:
        parts["scorers"] = scorer_weights
        parts["attribution"] = attribution
    formulas = {
        **formulas,
        "activations": ("layer inputs + one layer recomputed" if (s.checkpointing if checkpointing is None else checkpointing)
                        else "every layer's tensors") + " + TRL's fused head",
        "generation": {"colocate": f"vLLM share {s.vllm_share} x {s.gpu_memory_gib:g} GiB",
                       "server": "on the server's GPU"}.get(s.vllm or "", "gathered model + KV cache"),
        "replay": f"{mode}: " + ("gathered model" if mode == "gather" else "head") + " + fp32 head + [chunk, V] blocks",
        "overhead": "CUDA context, NCCL 1.5 GiB + 5 % fragmentation (assumed)",
        "reference": "none (beta = 0)" if not ref else f"beta {s.beta:g}: TRL's reference model, bf16, sharded",
        **({"scorers": f"{len(s.scorers)} model reward scorer(s), bf16, whole on each process",
            "attribution": "one attribution call of the largest scorer (replay)" if attribution
            else "none (the credit does not attribute)"} if s.scorers else {}),
    }  # fmt: skip
    return Memory(parts, phases, formulas, ds, mode, kv_tokens, kv_needed)
