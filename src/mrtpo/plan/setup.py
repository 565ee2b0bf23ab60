"""What ``mrtpo plan`` plans: a recipe read into one engine-neutral :class:`Setup`, with the assumptions
it needs and a recipe does not say (the task's token lengths and pass rates), each stated and
overridable.

TRL recipes are read through the recipe loader (``mrtpo.integrations.trl.recipe.load_config``), with
``MRTPOConfig``'s defaults for the fields a recipe leaves out: TRL's, read from the description of
``GRPOConfig``'s fields the package ships (:mod:`mrtpo.integrations.trl.trl_fields`, so TRL is not
imported), and those of :class:`~mrtpo.integrations.trl.fields.MRTPOFields`. verl recipes are read as data:
the recipe's YAML over verl's flattened default config (``verl/trainer/config/_generated_ppo_trainer.yaml``
when verl is installed).

Task profiles (:data:`TASKS`) are assumptions about the paper's data, not measurements: token counts of
the rollout prompt, of each reward's information segment (what replay leaves out for it), of privileged
segments (shown only in replay), of the prefix all of a prompt's contexts share, the mean response, and
each binary reward's pass rate (the share of responses that score 1). A reward's *active share* is the
chance that its advantage is not 0 for a response: for GDPO-style group z-scores that is the chance the
reward varies within the group of G responses, ``1 - p^G - (1 - p)^G`` for a pass rate p; a continuous
reward has its active share given directly.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from mrtpo.method import MethodConfig
from mrtpo.plan.shapes import GPUS, Gpu, Shape, model_shape
from mrtpo.recipes import get


@dataclasses.dataclass(frozen=True)
class Reward:
    name: str
    info_tokens: int  # tokens of the segment replay leaves out for this reward (0: none)
    pass_rate: float | None = None  # binary rewards: share of responses scoring 1
    active: float | None = None  # continuous rewards: share of groups in which it varies

    def active_share(self, group: int) -> float:
        if self.active is not None:
            return self.active
        p = float(self.pass_rate)
        return 1.0 - p**group - (1.0 - p) ** group


@dataclasses.dataclass(frozen=True)
class TaskProfile:
    """Assumed token counts (means; ``prompt_max`` bounds the padded micro-batch) and pass rates."""

    rollout_tokens: int
    prompt_max: int
    response_tokens: int
    privileged_tokens: int
    shared_prefix: int
    rewards: tuple[Reward, ...]
    note: str


TASKS: dict[str, TaskProfile] = {
    "sql": TaskProfile(
        rollout_tokens=450,
        prompt_max=1024,
        response_tokens=250,
        privileged_tokens=45,
        shared_prefix=55,
        rewards=(
            Reward("format", 65, pass_rate=0.9),
            Reward("executable", 340, pass_rate=0.8),
            Reward("execution", 45, pass_rate=0.5),
        ),
        note="Spider: schema ~340 tokens, question ~25, format instruction ~65, reference SQL ~45 (privileged)",
    ),
    "instruct": TaskProfile(
        rollout_tokens=300,
        prompt_max=1024,
        response_tokens=500,
        privileged_tokens=0,
        shared_prefix=40,
        rewards=tuple(Reward(f"c{k}", 22, pass_rate=0.7) for k in range(9)),
        note="HIR-16K: 9 constraints of ~22 tokens per prompt (5 to 13; the empty slots of K = 13 are never replayed)",
    ),
    "tools": TaskProfile(
        rollout_tokens=800,
        prompt_max=2048,
        response_tokens=200,
        privileged_tokens=60,
        shared_prefix=100,
        rewards=(Reward("format", 150, pass_rate=0.9), Reward("correctness", 60, active=0.9)),
        note="RLLA: tool descriptions ~600 tokens, format instruction ~150, reference calls ~60 (privileged)",
    ),
    "toy": TaskProfile(
        rollout_tokens=40,
        prompt_max=64,
        response_tokens=8,
        privileged_tokens=0,
        shared_prefix=8,
        rewards=tuple(Reward(n, 4, pass_rate=0.4) for n in ("start", "end", "include", "length")),
        note="the synthetic task: 4 listed constraints of ~4 tokens",
    ),
}
GENERIC = TaskProfile(
    rollout_tokens=500, prompt_max=1024, response_tokens=300, privileged_tokens=0, shared_prefix=50,
    rewards=(Reward("r0", 50, pass_rate=0.5), Reward("r1", 50, pass_rate=0.5)),
    note="a task of your own: 2 rewards of 50-token segments assumed (--rollout-tokens, --info-tokens adjust)",
)  # fmt: skip


@dataclasses.dataclass
class Setup:
    """The run ``mrtpo plan`` plans, engine-neutral. Lengths are tokens; batches are responses."""

    recipe: str
    engine: str  # trl | verl
    task: str
    shape: Shape
    gpu: Gpu
    gpu_memory_gib: float
    gpus: int  # per node
    nodes: int
    processes: int  # training processes (all nodes)
    sharding: str  # zero3 | fsdp2 | ddp
    offload: str  # none | optimizer | all (DeepSpeed)
    weights_dtype_bytes: int  # the model's dtype (2: bfloat16)
    lora: dict[str, Any] | None
    group: int  # G
    responses_per_step: int  # generation batch (responses per optimizer step, all processes)
    micro_batch: int  # rows per forward/backward on one process
    checkpointing: bool
    max_completion: int
    profile: TaskProfile
    rollout_tokens: int
    response_tokens: int
    prompt_max: int
    vllm: str | None  # colocate | server | None (transformers' generate)
    vllm_share: float  # fraction of the GPU's memory a colocated engine takes
    vllm_sleeps: bool  # the engine frees its memory while training (sleep mode / verl's free_cache_engine)
    old_logprob_pass: bool
    credit: str
    replay_sharding: str  # auto | gather | lockstep | none
    replay_chunk: int
    replay_token_budget: int | None
    replay_kernel: str
    replay_prefix_sharing: bool
    replay_projection: str
    mfu: float
    notes: list[str] = dataclasses.field(default_factory=list)
    beta: float = 0.0  # KL coefficient: > 0 runs TRL's reference model
    prompt_lengths: tuple[int, ...] = ()  # the data's rollout prompt lengths (tokens), when read
    contexts: tuple[Any, ...] = ()  # the data's replay contexts (mrtpo.replay.contexts.Contexts), when read
    cpu: Any = None  # a mrtpo.plan.device.CpuProfile: time the step on this CPU (--device cpu)
    scorers: tuple[
        tuple[Shape, int, bool], ...
    ] = ()  # model rewards: (shape, attribution batch, checkpointing)

    @property
    def rows_per_process(self) -> int:
        return max(1, self.responses_per_step // self.processes)

    @property
    def replay_kind(self):
        """The replay kind of the credit scheme (mrtpo.replay.service.ReplayKind), None when it replays
        nothing."""
        import mrtpo.replay  # noqa: F401  (registers every built-in kind and scheme)
        from mrtpo.credit import scheme
        from mrtpo.replay.service import replay_kind

        name = scheme(self.credit).replay
        return None if name == "none" else replay_kind(name)

    @property
    def replays(self) -> bool:
        return self.replay_kind is not None


def _dataclass_defaults(cls) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def trl_defaults() -> dict[str, Any]:
    """``MRTPOConfig``'s field defaults without importing TRL: GRPOConfig's from the shipped description of
    its fields, then MRTPOFields'."""
    from mrtpo.integrations.trl import trl_fields
    from mrtpo.integrations.trl.fields import MRTPOFields

    grpo = {name: f["default"] for name, f in trl_fields.load()["fields"].items()}
    return {**grpo, **_dataclass_defaults(MRTPOFields)}


def _profile(task: str, args) -> TaskProfile:
    return _apply_pass_rates(TASKS.get(task, GENERIC), args)


def _apply_pass_rates(prof: TaskProfile, args) -> TaskProfile:
    rewards = list(prof.rewards)
    for spec in getattr(args, "pass_rate", None) or []:
        name, eq, value = str(spec).rpartition("=")
        p = float(value)
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"--pass-rate {spec!r}: a pass rate is in [0, 1]")
        hit = False
        for i, r in enumerate(rewards):
            if not eq or r.name == name:
                rewards[i] = dataclasses.replace(r, pass_rate=p, active=None)
                hit = True
        if eq and not hit:
            raise ValueError(
                f"--pass-rate {spec!r}: no reward {name!r}; rewards: {', '.join(r.name for r in rewards)}"
            )
    return dataclasses.replace(prof, rewards=tuple(rewards))


def _common(args, task: str, max_completion: int) -> dict[str, Any]:
    prof = _profile(task, args)
    gpu = GPUS[args.gpu]
    rollout = args.rollout_tokens or prof.rollout_tokens
    response = min(args.response_tokens or prof.response_tokens, max_completion)
    return dict(
        task=task, gpu=gpu, gpu_memory_gib=float(args.gpu_memory or gpu.memory_gib), gpus=int(args.gpus),
        nodes=int(args.nodes), profile=prof, rollout_tokens=rollout, response_tokens=response,
        prompt_max=max(args.prompt_max or prof.prompt_max, rollout), mfu=float(args.mfu),
        offload=args.offload, max_completion=max_completion,
    )  # fmt: skip


def trl_setup(recipe: str, pairs: list[tuple[str, Any]], args) -> Setup:
    from mrtpo.integrations.trl.recipe import load_config

    cfg = load_config(recipe, pairs)
    t = {**trl_defaults(), **cfg.trainer}
    data: dict[str, Any] = {}
    if cfg.model.get("tiny") is not None:
        shape, data = _tiny_data(cfg)
    elif not cfg.model.get("path"):
        raise ValueError(
            f"{recipe}: mrtpo plan needs model.path (a shipped config or a local folder) or model.tiny"
        )
    else:
        shape = model_shape(str(cfg.model["path"]))
    gpus, nodes = int(args.gpus), int(args.nodes)
    vllm = t["vllm_mode"] if t.get("use_vllm") else None
    notes = []
    processes = gpus * nodes
    if vllm == "server":  # the split mrtpo launch makes: the server's GPUs do not train
        from mrtpo.recipes import server_split

        served, trained = server_split(gpus, t) if nodes == 1 else ([gpus - 1], list(range(gpus - 1)))
        processes = len(trained) * nodes
        notes.append(
            f"vLLM server mode: {len(served)} GPU{'s' * (len(served) > 1)} serve, {processes} train (the split "
            "mrtpo launch --vllm server makes)"
        )
    pdtbs = int(t["per_device_train_batch_size"])
    gbs = t.get("generation_batch_size")
    if gbs is None:
        spg = t.get("steps_per_generation") or t["gradient_accumulation_steps"]
        gbs = pdtbs * processes * int(spg)
    dtype = str(cfg.model.get("dtype", "auto"))
    generate_every = max(1, int(gbs) // max(1, pdtbs * processes)) * int(t.get("num_iterations", 1))
    old_pass = bool(
        (vllm is not None and t.get("vllm_importance_sampling_correction", True))
        or int(t["gradient_accumulation_steps"]) % generate_every != 0
    )
    common = _common(args, str(cfg.task["name"]), int(t["max_completion_length"]))
    if data:
        common["profile"] = _data_profile(common["profile"], data, args)
        common["rollout_tokens"] = args.rollout_tokens or round(sum(data["prompts"]) / len(data["prompts"]))
        common["prompt_max"] = max(data["prompts"])
        notes.append(
            f"model.tiny: the plan read the task's {len(data['prompts'])} prompts (lengths and contexts)"
        )
    scorers = _scorers((cfg.task.get("options") or {}).get("model_rewards") or (), notes)
    return Setup(
        recipe=recipe, engine="trl", shape=shape, processes=processes, sharding=args.sharding or "zero3",
        weights_dtype_bytes=4 if dtype == "float32" or (data and dtype == "auto") else 2, lora=dict(cfg.peft) if cfg.peft else None,
        group=int(t["num_generations"]), responses_per_step=int(gbs), micro_batch=pdtbs,
        checkpointing=bool(t.get("gradient_checkpointing", True)),
        vllm=vllm, vllm_share=float(t.get("vllm_gpu_memory_utilization", 0.3)),
        vllm_sleeps=bool(t.get("vllm_enable_sleep_mode", False)), old_logprob_pass=old_pass,
        credit=_trl_credit(t.get("method")), replay_sharding=str(t["replay_sharding"]), replay_chunk=int(t["replay_chunk_size"]),
        replay_token_budget=t["replay_token_budget"], replay_kernel=str(t["replay_distance_kernel"]),
        replay_prefix_sharing=bool(t["replay_prefix_sharing"]), replay_projection=str(t["replay_projection_dtype"]),
        notes=notes, beta=float(t.get("beta") or 0.0), prompt_lengths=tuple(data.get("prompts", ())),
        contexts=tuple(data.get("contexts", ())), cpu=getattr(args, "cpu_profile", None), scorers=scorers,
        **common,
    )  # fmt: skip


def _scorers(specs, notes: list[str]) -> tuple[tuple[Shape, int, bool], ...]:
    """The model rewards' scorers the plan can size (``task.options.model_rewards``: each local one's shape,
    attribution batch and checkpointing); a reward server (``url``) holds no memory here, and a scorer whose
    shape is not known offline is named in a note."""
    out = []
    for spec in specs:
        if not isinstance(spec, dict) or not spec.get("model") or spec.get("model") == "policy":
            continue
        try:
            shape = model_shape(str(spec["model"]))
        except (FileNotFoundError, ValueError):
            notes.append(
                f"model reward {spec.get('name', spec['model'])!r}: its shape is not known offline, not counted"
            )
            continue
        out.append(
            (
                shape,
                int(spec.get("attribution_batch_size", 1)),
                bool(spec.get("gradient_checkpointing", True)),
            )
        )
    return tuple(out)


def _tiny_data(cfg) -> tuple[Shape, dict[str, Any]]:
    """A ``model.tiny`` recipe: its model's shape (the vocabulary is the data's words) and, from the task's
    data as ``mrtpo train`` loads it, the rollout prompt lengths and the replay contexts of each distinct
    prompt (through the tokenizer's chat template, as the trainer tokenizes them)."""
    from mrtpo.integrations.trl.checks import load_task_spec
    from mrtpo.integrations.trl.recipe import _tiny_model_and_tokenizer
    from mrtpo.replay.contexts import build_contexts

    task = load_task_spec(cfg.task["name"], cfg.task["options"])
    d = cfg.data
    examples = list(task.load(d["source"], split=d["split"], limit=d["limit"]))
    if not examples:
        raise ValueError(f"task {cfg.task['name']!r} loaded no training examples from {d['source']!r}")
    model, tok = _tiny_model_and_tokenizer(cfg.model["tiny"], examples, "float32")
    shape = Shape.from_config(
        model.config.to_dict(), "model.tiny", "model.tiny (random, built from the config)"
    )
    names = list(task.reward_names)
    seen: dict[str, Any] = {}
    for ex in examples:
        key = repr([(s.text, sorted(s.rewards), s.privileged, s.role) for s in ex.segments])
        if key not in seen:
            seen[key] = build_contexts(tok, ex.segments, names)
    contexts = list(seen.values())
    prompts = [len(seen[repr([(s.text, sorted(s.rewards), s.privileged, s.role) for s in ex.segments])].rollout)
               for ex in examples]  # fmt: skip
    return shape, {"prompts": prompts, "contexts": contexts, "rewards": names}


def _data_profile(prof: TaskProfile, data: dict[str, Any], args) -> TaskProfile:
    """The task profile with the data's rewards and mean lengths (pass rates: the profile's for a reward
    it names, else its mean; ``--pass-rate`` applies after)."""
    ctxs = data["contexts"]
    rates = {r.name: r.pass_rate for r in prof.rewards if r.pass_rate is not None}
    default = sum(rates.values()) / len(rates) if rates else 0.5
    rewards = []
    for k, name in enumerate(data["rewards"]):
        info = sum(len(c.full) - len(c.leave_one_out[k]) for c in ctxs) / len(ctxs)
        rewards.append(Reward(name, round(info), pass_rate=rates.get(name, default)))
    mean_full = sum(len(c.full) - len(c.rollout) for c in ctxs) / len(ctxs)
    out = dataclasses.replace(prof, rewards=tuple(rewards), privileged_tokens=round(mean_full),
                              note=prof.note + "; lengths and segments from the data")  # fmt: skip
    return _apply_pass_rates(out, args)


def _trl_credit(method: Any) -> str:
    """The credit scheme of a TRL config's method block (a mapping or a MethodConfig; absent: its default)."""
    from mrtpo.method import MethodConfig

    if isinstance(method, MethodConfig):
        return str(method.credit)
    return str(MethodConfig.from_dict(dict(method or {}), prefix="method.").credit)


def _merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def verl_defaults() -> dict[str, Any]:
    """verl's flattened default trainer config, as data ({} when verl is not installed)."""
    import importlib.util

    import yaml

    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = (
        Path(next(iter(spec.submodule_search_locations)))
        / "trainer"
        / "config"
        / "_generated_ppo_trainer.yaml"
    )
    return yaml.safe_load(path.read_text()) if path.is_file() else {}


def verl_setup(recipe: str, raw: dict[str, Any], overrides: list[tuple[str, Any]], args) -> Setup:
    cfg = _merge(verl_defaults(), raw)
    for key, value in overrides:
        node = cfg
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    path = get(cfg, "actor_rollout_ref.model.path")
    shape = model_shape(str(path))
    gpus, nodes = int(args.gpus), int(args.nodes)
    n = int(get(cfg, "actor_rollout_ref.rollout.n", 1))
    strategy = str(get(cfg, "actor_rollout_ref.actor.strategy", "fsdp"))
    mrtpo = get(cfg, "algorithm.mrtpo", {}) or {}
    replay = mrtpo.get("replay") or {}
    task = "sql" if "sql" in Path(recipe).stem else "instruct" if "instruct" in Path(recipe).stem else (
        "tools" if "tools" in Path(recipe).stem else "generic")  # fmt: skip
    notes = [f"verl: the actor is {strategy} (planned as FSDP2: fp32 parameters, bf16 compute)"]
    return Setup(
        recipe=recipe, engine="verl", shape=shape, processes=gpus * nodes, sharding=args.sharding or "fsdp2",
        weights_dtype_bytes=2, lora=None, group=n,
        responses_per_step=int(get(cfg, "data.train_batch_size", 32)) * n,
        micro_batch=int(get(cfg, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu") or 1),
        checkpointing=bool(get(cfg, "actor_rollout_ref.model.enable_gradient_checkpointing", True)),
        vllm="colocate", vllm_share=float(get(cfg, "actor_rollout_ref.rollout.gpu_memory_utilization", 0.5)),
        vllm_sleeps=bool(get(cfg, "actor_rollout_ref.rollout.free_cache_engine", True)), old_logprob_pass=True,
        credit=str(mrtpo.get("credit", MethodConfig.credit) if mrtpo else "none"), replay_sharding=str(replay.get("sharding", "auto")),
        replay_chunk=int(replay.get("chunk_size", 256)), replay_token_budget=replay.get("token_budget", 16384),
        replay_kernel=str(replay.get("distance_kernel", "auto")),
        replay_prefix_sharing=bool(replay.get("prefix_sharing", True)),
        replay_projection=str(replay.get("projection_dtype", "float32")), notes=notes, beta=_verl_beta(cfg),
        **{**_common(args, task, int(get(cfg, "data.max_response_length", 1024))),
           "prompt_max": int(get(cfg, "data.max_prompt_length", 1024))},
    )  # fmt: skip


def _verl_beta(cfg: dict[str, Any]) -> float:
    """The KL coefficient that makes verl run its reference model (a KL loss or a KL penalty in the reward)."""
    if get(cfg, "actor_rollout_ref.actor.use_kl_loss", False):
        return float(get(cfg, "actor_rollout_ref.actor.kl_loss_coef", 0.001))
    if get(cfg, "algorithm.use_kl_in_reward", False):
        return float(get(cfg, "algorithm.kl_ctrl.kl_coef", 0.001))
    return 0.0
