"""The plan of a recipe: memory, step, verdict and the knobs that would make it fit; as a table or JSON.

:data:`ERRORS` is the stated error of each estimate, printed beside it; the figures come from
:mod:`mrtpo.plan.validate` (``python -m mrtpo.plan.validate``), whose measurements the tests repeat and
compare with these statements.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from mrtpo.plan.cost import Step, step
from mrtpo.plan.memory import GIB, Memory, memory, vllm_non_kv
from mrtpo.plan.setup import Setup

ERRORS = {
    "states_zero3": "±12 %: ZeRO-3, 2 CPU procs",
    "states_other": "formula; not measured",
    "activations": "±5 %: saved tensors, CPU (head: code)",
    "generation": "not measured (vLLM: GPU only)",
    "replay": "FPE exact vs ReplayStats; bytes not measured",
    "overhead": "assumed",
    "reference": "formula; not measured",
    "scorers": "formula (bf16 weights); not measured",
    "attribution": "formula; 1.1-1.5x under on CPU (scripts/attribution_memory.py)",
    "time": "GPU terms assumed (MFU, bandwidths, per-call times); not measured on a GPU",
    "time_cpu": "CPU: measured rates; 6-15 % under mrtpo train's median step, 4 configurations, with a profile "
    "measured under the run's load (docs/scale.md)",
}
"""The error of each estimate and where it was measured (``python -m mrtpo.plan.validate``; docs/scale.md):
ZeRO-3 model states -10 % between steps and +11 % in the optimizer step against DeepSpeed's estimate
(2 CPU processes, two Qwen2 shapes); saved activations within 3.7 % (Qwen2 and Qwen3 shapes, with and
without checkpointing); replay FPE equal to ReplayStats on a known batch."""


def errors(s: Setup) -> dict[str, str]:
    """The stated error of each part for this setup."""
    states = (
        ERRORS["states_zero3"]
        if s.sharding == "zero3" and not s.lora and s.offload == "none"
        else ERRORS["states_other"]
    )
    return {"weights": states, "gradients": states, "optimizer": states,
            **{k: ERRORS[k] for k in ("activations", "generation", "replay", "overhead", "reference", "scorers",
                                      "attribution")},
            "time": ERRORS["time_cpu" if s.cpu is not None else "time"]}  # fmt: skip


@dataclasses.dataclass
class Knob:
    change: str
    total_gib: float
    fits: bool


@dataclasses.dataclass
class Plan:
    setup: Setup
    memory: Memory
    step: Step
    knobs: list[Knob]
    warnings: list[str]

    @property
    def capacity(self) -> int:
        return int(self.setup.gpu_memory_gib * GIB)

    @property
    def fits(self) -> bool:
        return fits(self.setup, self.memory)

    def verdict(self) -> str:
        m, cap = self.memory, self.capacity
        used = f"{m.total / GIB:.1f} of {cap / GIB:g} GiB per GPU (peak: {m.peak_phase})"
        if self.fits:
            return f"fits: {used}"
        fixes = [k.change for k in self.knobs if k.fits]
        head = f"does not fit: {used}"
        if self.setup.vllm == "colocate" and m.kv_tokens == 0:
            head = f"does not fit: vLLM's share ({self.setup.vllm_share}) cannot hold the model and its workspace"
        return head + ("; turn: " + "; or ".join(fixes[:3]) if fixes else "; no single knob here is enough")


KNOB_NAMES = {
    "trl": {"replay": "--replay.sharding lockstep", "share": "--trl.vllm_gpu_memory_utilization",
            "sleep": "--trl.vllm_enable_sleep_mode true", "micro": "--trl.per_device_train_batch_size",
            "ckpt": "--trl.gradient_checkpointing true"},
    "verl": {"replay": "algorithm.mrtpo.replay.sharding=lockstep",
             "share": "actor_rollout_ref.rollout.gpu_memory_utilization=",
             "sleep": "actor_rollout_ref.rollout.free_cache_engine=true",
             "micro": "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=",
             "ckpt": "actor_rollout_ref.model.enable_gradient_checkpointing=true"},
}  # fmt: skip
"""How each knob is spelled in a recipe override of each engine."""

NODE_GPUS = 8  # the most GPUs the plan suggests in one machine


def fits(s: Setup, m: Memory) -> bool:
    """The peak fits the GPU and a colocated engine has room for a KV cache."""
    return m.total <= s.gpu_memory_gib * GIB and (s.vllm != "colocate" or m.kv_tokens > 0)


def _knobs(s: Setup, mem: Memory) -> list[Knob]:
    """Changes that move the peak, each planned again alone (whether the plan fits or not), and, when
    none fits alone, the memory ones together."""
    cap = s.gpu_memory_gib * GIB
    names = KNOB_NAMES[s.engine]
    sep = "" if s.engine == "verl" else " "
    out: list[Knob] = []
    together: dict[str, Any] = {}
    together_names: list[str] = []

    def add(change: str, setup: Setup, replay: str | None = None, combine: dict | None = None) -> None:
        m = memory(setup, replay)
        out.append(Knob(change, round(m.total / GIB, 2), fits(setup, m)))
        if combine is not None:
            together.update(combine)
            together_names.append(change.split(" (")[0])

    if s.replays and mem.replay_mode == "gather":
        add(
            f"{names['replay']} (replay holds the head, not the whole model)",
            s,
            "lockstep",
            {"_replay": "lockstep"},
        )
    if s.vllm == "colocate":
        kv_tok = s.shape.kv_bytes_per_token(2)
        engine = sum(vllm_non_kv(s).values())
        if mem.kv_tokens == 0:
            least = math.ceil((engine + (s.prompt_max + s.max_completion) * kv_tok) / cap * 100) / 100
            add(f"{names['share']}{sep}{least} (the least that holds the engine's model, workspace and one sequence)",
                dataclasses.replace(s, vllm_share=least), combine={"vllm_share": least})  # fmt: skip
        else:
            share = math.ceil((engine + mem.kv_needed * kv_tok) / cap * 100) / 100
            if share < s.vllm_share:
                add(f"{names['share']}{sep}{share} (enough KV cache for the batch at full length)",
                    dataclasses.replace(s, vllm_share=share), combine={"vllm_share": share})  # fmt: skip
        if not s.vllm_sleeps:
            add(f"{names['sleep']} (the engine frees its memory while training)",
                dataclasses.replace(s, vllm_sleeps=True), combine={"vllm_sleeps": True})  # fmt: skip
    if s.micro_batch > 1:
        half = s.micro_batch // 2
        add(f"{names['micro']}{sep}{half} (the micro-batch; as many responses per step)",
            dataclasses.replace(s, micro_batch=half), combine={"micro_batch": half})  # fmt: skip
    if not s.checkpointing:
        add(names["ckpt"], dataclasses.replace(s, checkpointing=True), combine={"checkpointing": True})
    if s.sharding == "zero3" and s.offload == "none" and not s.lora:
        add("optimizer offload to CPU (accelerate config offload_optimizer_device: cpu; plan: --offload optimizer)",
            dataclasses.replace(s, offload="optimizer"))  # fmt: skip
    if s.sharding in ("zero3", "fsdp2") and s.vllm != "server" and s.cpu is None:
        for factor in (2, 4):
            if s.nodes == 1 and s.gpus * factor <= NODE_GPUS:  # more GPUs in this machine
                more = dataclasses.replace(s, gpus=s.gpus * factor, processes=s.processes * factor)
                add(f"--gpus {s.gpus * factor} (one machine)", more)
            elif s.gpus >= NODE_GPUS or s.nodes > 1:  # more machines of as many GPUs
                more = dataclasses.replace(s, nodes=s.nodes * factor, processes=s.processes * factor)
                add(f"{s.gpus * s.nodes * factor} GPUs (--nodes {s.nodes * factor} of {s.gpus})", more)
    if len(together_names) > 1 and not any(k.fits for k in out):
        replay = together.pop("_replay", None)
        add("together: " + ", ".join(together_names), dataclasses.replace(s, **together), replay)
    return out


def _warnings(s: Setup, mem: Memory) -> list[str]:
    out = []
    if s.vllm == "colocate" and 0 < mem.kv_tokens < mem.kv_needed:
        waves = math.ceil(mem.kv_needed / mem.kv_tokens)
        out.append(
            f"vLLM's KV cache holds {mem.kv_tokens:,} tokens; the process's generation batch needs "
            f"{mem.kv_needed:,} at full length: up to {waves} waves of generation (slower, not an error)"
        )
    if s.responses_per_step % s.processes:
        out.append(
            f"{s.responses_per_step} responses per step do not split evenly over {s.processes} processes"
        )
    return out


def make_plan(s: Setup) -> Plan:
    mem = memory(s)
    return Plan(s, mem, step(s, mem), _knobs(s, mem), _warnings(s, mem))


def as_json(plan: Plan) -> dict[str, Any]:
    s, m, st = plan.setup, plan.memory, plan.step
    gib = {k: round(v / GIB, 3) for k, v in m.parts.items()}
    gib["total"] = round(m.total / GIB, 3)
    replay_s = st.phases.get("replay", {}).get("seconds", 0.0)
    return {
        "recipe": s.recipe,
        "engine": s.engine,
        "model": {"path": s.shape.name, "config": s.shape.source, "params": s.shape.params()},
        "gpu": {"name": s.gpu.name, "memory_gib": s.gpu_memory_gib, "count": s.gpus, "nodes": s.nodes},
        "processes": s.processes,
        "sharding": s.sharding,
        "memory_gib": gib,
        "phases_gib": {k: round(v / GIB, 3) for k, v in m.phases.items()},
        "deepspeed_model_states_gib": None if m.deepspeed is None else round(m.deepspeed / GIB, 3),
        "replay_sharding": m.replay_mode,
        "kv_cache_tokens": m.kv_tokens,
        "kv_tokens_needed": m.kv_needed,
        "fits": plan.fits,
        "verdict": plan.verdict(),
        "knobs": [dataclasses.asdict(k) for k in plan.knobs],
        "warnings": plan.warnings,
        "step": {
            "seconds": round(st.seconds, 3),
            "phases": {k: {"tflop": round(v["tflop"], 3), "seconds": round(v["seconds"], 3)} for k, v in st.phases.items()},
            "replay_share": round(replay_s / st.seconds, 4) if st.seconds else 0.0,
            "fpe_per_response": round(st.fpe_per_response, 4),
            "fpe_limit_per_response": round(st.fpe_limit_per_response, 4),
            "active_pairs_per_response": round(st.active_pairs, 4),
            "responses_per_process": s.rows_per_process,
            "padded_prompt_tokens": round(st.padded_prompt, 1),
            "padded_completion_tokens": round(st.padded_completion, 1),
            "rates": st.rates,
            "mfu": None if s.cpu is not None else s.mfu,
        },
        "assumptions": {
            "task": s.task,
            "profile": s.profile.note,
            "rollout_tokens": s.rollout_tokens,
            "response_tokens": s.response_tokens,
            "prompt_max": s.prompt_max,
            "pass_rates": {r.name: r.pass_rate for r in s.profile.rewards if r.pass_rate is not None},
            "active_shares": {r.name: round(r.active_share(s.group), 4) for r in s.profile.rewards},
            "device": assumed_terms(s),
        },
        "errors": errors(s),
        "notes": s.notes,
    }  # fmt: skip


def _num(x: float) -> str:
    """An 8-wide figure: whole numbers from 100, one decimal from 1, three significant digits below."""
    return f"{x:8.0f}" if x >= 100 else f"{x:8.1f}" if x >= 1 else f"{x:8.3g}"


def assumed_terms(s: Setup) -> list[str]:
    """The terms of the step's time that are assumptions, not measurements, for this setup."""
    from mrtpo.plan import cost, device

    out = []
    if s.cpu is None:
        out.append(f"MFU {s.mfu:g} of the stated bf16 rate")
        if s.vllm is not None:
            out.append(
                f"decode at {device.GPU_DECODE_BANDWIDTH:g} of the HBM bandwidth; no per-call time (CUDA graphs)"
            )
            out.append(f"weight sync {cost.INTRA_NODE_BPS / 1e9:g} GB/s in a node, {cost.INTER_NODE_BPS / 1e9:g} "
                       f"across, {cost.GATHER_LATENCY_S * 1e3:g} ms per tensor")  # fmt: skip
        out.append(f"{device.GPU_LAYER_CALL_S * 1e3:g} ms per decoder-layer call of an eager pass")
    out.append("padded completion = max_completion_length")
    if not s.prompt_lengths:
        out.append(f"padded prompt = the profile's prompt_max {s.prompt_max}")
    if s.replays:
        out.append("pass rates of the task profile (--pass-rate)")
    return out


def table(plan: Plan) -> str:
    s, m, st = plan.setup, plan.memory, plan.step
    sh = s.shape
    shard = {"zero3": "DeepSpeed ZeRO-3", "fsdp2": "FSDP2", "ddp": "DDP"}[s.sharding]
    if s.offload != "none":
        shard += f", offload {s.offload}"
    lines = [
        f"mrtpo plan: {s.recipe} on {s.gpus * s.nodes} x {s.gpu.name} ({s.gpu_memory_gib:g} GiB), "
        f"{s.processes} training processes, {shard}",
        f"model: {sh.name} ({sh.source}): {sh.params() / 1e9:.2f} B parameters, V = {sh.vocab:,}, H = {sh.hidden:,}",
        f"step: {s.responses_per_step} responses (G = {s.group}), {s.rows_per_process} per process, micro-batch "
        f"{s.micro_batch}, sequences up to {s.prompt_max} + {s.max_completion} tokens",
        "",
        f"{'memory per GPU':22s} {'GiB':>7s}  {'how':56s}  error",
    ]
    err = errors(s)
    for part in ("weights", "gradients", "optimizer", "reference", "scorers", "activations", "generation", "replay",
                 "attribution", "overhead"):  # fmt: skip
        if part in ("reference", "scorers", "attribution") and not m.parts.get(part):
            continue
        lines.append(f"  {part:20s} {m.parts[part] / GIB:7.2f}  {m.formulas[part][:56]:56s}  {err[part]}")
    if m.deepspeed is not None:
        lines.append(f"  {'(DeepSpeed estimate)':20s} {m.deepspeed / GIB:7.2f}  weights + gradients + optimizer, "
                     "estimate_zero3_model_states_mem_needs")  # fmt: skip
    phases = ", ".join(f"{k} {v / GIB:.1f}" for k, v in m.phases.items())
    lines.append(f"  {'total':20s} {m.total / GIB:7.2f}  peak over phases: {phases}")
    lines += ["", f"verdict: {plan.verdict()}"]
    lines += [f"  warning: {w}" for w in plan.warnings]
    if plan.knobs:
        lines.append("  knobs (total GiB per GPU if turned alone):")
        for k in plan.knobs:
            lines.append(f"    {k.total_gib:7.1f}  {'fits ' if k.fits else 'over '} {k.change}")
    where = "process (CPU)" if s.cpu is not None else "GPU"
    lines += [
        "",
        f"{'step per ' + where:22s} {'TFLOP':>8s} {'seconds':>8s}  padded to {st.padded_prompt:.0f} + "
        f"{st.padded_completion:.0f} tokens (longest prompt and completion of a generation batch)",
    ]
    for name, ph in st.phases.items():
        extra = ""
        if name == "replay":
            extra = (f"  {st.fpe_per_response:.2f} FPE per response ({st.fpe_limit_per_response:.2f} with the shared "
                     f"prefix once), {st.active_pairs:.2f} active pairs")  # fmt: skip
        lines.append(f"  {name:20s} {_num(ph['tflop'])} {_num(ph['seconds'])}{extra}")
    replay_s = st.phases.get("replay", {}).get("seconds", 0.0)
    share = f", replay {100 * replay_s / st.seconds:.0f} % of it" if st.seconds and replay_s else ""
    lines.append(f"  {'total':20s} {'':8s} {_num(st.seconds)}  on {st.rates}{share}; {errors(s)['time']}")
    lines.append("  assumed: " + "; ".join(assumed_terms(s)))
    act = ", ".join(f"{r.name} {r.active_share(s.group):.2f}" for r in s.profile.rewards[:4])
    more = "" if len(s.profile.rewards) <= 4 else f", ... ({len(s.profile.rewards)} rewards)"
    lines += [
        "",
        f"assumptions ({s.task}): {s.profile.note}; rollout prompt {s.rollout_tokens} tokens, responses "
        f"{s.response_tokens} on average; active shares {act}{more} (--pass-rate, --rollout-tokens, "
        "--response-tokens change them)",
    ]
    lines += [f"note: {n}" for n in s.notes]
    return "\n".join(lines)
