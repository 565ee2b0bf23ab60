"""The configuration matrix: every way users train, each cell trained through ``mrtpo train``'s own path
for a few steps with its replay, CoRT relevance and OPSD divergence checked against a float32 reference.

Axes (:class:`Cell`):

- ``engine``: ``single`` (one process), ``ddp`` (2 processes, data parallel), ``fsdp2`` (2 processes,
  accelerate's FSDP2: one unit per decoder layer), ``zero3`` (2 processes, DeepSpeed ZeRO-3);
- ``precision``: ``fp32``; ``bf16`` / ``fp16`` (TRL's ``bf16=True`` / ``fp16=True``: accelerate's
  autocast on one process and DDP, FSDP2's mixed precision ``param_dtype`` under FSDP2, DeepSpeed's
  bf16 / fp16 under ZeRO-3); ``bf16-weights`` (the model loaded in bfloat16, TRL's precision flags off);
- ``adapter``: ``full`` fine-tuning or ``lora`` (PEFT LoRA on the attention projections with the LM head
  in ``modules_to_save``, random non-zero initialisation so the adapter changes every forward, and TRL's
  KL term on, whose reference model is the policy with its adapter disabled);
- ``credit`` x ``loss``: ``none``, ``reward``, ``joint``, ``cort``, ``p2t`` with the policy loss, and ``none``
  with the OPSD loss (OPSD with another credit is refused by the config: it uses no advantages). A ``p2t``
  cell adds a model reward (a tiny float32 sequence classifier on its own tokenizer, built by the launcher)
  to the toy task's five rule rewards: its rows hold P2T's weights, the rule rows replayed distances.

Each cell trains :data:`STEPS` optimizer steps of the toy task on a tiny random Qwen2 model, two per
sampled batch (``num_iterations: 2``, so TRL runs its old-log-probability pass and replay reuses it). At every
replay (and CoRT pass, and OPSD loss) the worker gathers the full weights (collective, every process),
loads them into a float32 copy of the policy and recomputes the same quantity naively: full-vocabulary
logits of each context, log-softmax and the Jensen–Shannon distance in float64. A cell passes when
every replayed value is within the error bound of its precision (:func:`mrtpo.distance.js_error_bound`), measured on
the same tokens: ``|d - d32| <= 2 g(delta) + 1e-5`` with ``delta`` the largest logit difference between
the cell's precision and float32 over the response's tokens and both contexts (``4 delta / tau`` for
CoRT's log-probability gap). A ``p2t`` cell's attributed rows (the scorer's, in float32 whatever the
policy's precision) are checked to be exactly the model reward's active pairs and to average 1 over each
response (1e-5). A cell that cannot run is refused before its first step with one line.

Run it (one launch per engine; each engine's cells share the processes)::

    mrtpo matrix                          # the representative subset (the CI test's cells)
    mrtpo matrix --full                   # all cells (about 4 minutes on 2 CPU cores)
    mrtpo matrix --engines zero3 --full   # one engine
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from mrtpo.io import append_jsonl, read_jsonl

ENGINES = ("single", "ddp", "fsdp2", "zero3")
PRECISIONS = ("fp32", "bf16", "fp16", "bf16-weights")
ADAPTERS = ("full", "lora")
CREDITS = (
    ("none", "policy"),
    ("reward", "policy"),
    ("joint", "policy"),
    ("cort", "policy"),
    ("p2t", "policy"),
    ("none", "opsd"),
)
STEPS = 4
SLACK = 1e-5
"""Float32 slack on top of the precision bound (the exact replay's own error is below 1e-7)."""
OPSD_SLACK = 1e-6
"""Float32 slack of the OPSD divergence in nats (a difference of logarithms, exact to ~1e-7 at O(1))."""


@dataclasses.dataclass(frozen=True)
class Cell:
    engine: str
    precision: str
    adapter: str
    credit: str
    loss: str
    sharding: str = "auto"  # method.replay_sharding (a suffix "@gather" / "@lockstep" in the name)

    @property
    def name(self) -> str:
        tail = self.credit if self.loss == "policy" else "opsd"
        at = "" if self.sharding == "auto" else f"@{self.sharding}"
        return f"{self.engine}/{self.precision}/{self.adapter}/{tail}{at}"

    @classmethod
    def parse(cls, name: str) -> Cell:
        """``ENGINE/PRECISION/ADAPTER/CREDIT[@SHARDING]`` (CREDIT ``opsd``: credit none, the OPSD loss)."""
        body, _, sharding = name.partition("@")
        parts = body.split("/")
        ok = len(parts) == 4 and sharding in ("", "auto", "gather", "lockstep", "none")
        if ok:
            engine, precision, adapter, tail = parts
            ok = engine in ENGINES and precision in PRECISIONS and adapter in ADAPTERS
            ok = ok and tail in ("none", "reward", "joint", "cort", "p2t", "opsd")
        if not ok:
            raise ValueError(
                f"cell {name!r}: expected ENGINE/PRECISION/ADAPTER/CREDIT[@SHARDING] from {ENGINES}, "
                f"{PRECISIONS}, {ADAPTERS}, none|reward|joint|cort|p2t|opsd, @gather|@lockstep"
            )
        credit, loss = ("none", "opsd") if tail == "opsd" else (tail, "policy")
        return cls(engine, precision, adapter, credit, loss, sharding or "auto")

    def config(self, out: str | Path, device: str = "cpu", reward_model: str | None = None) -> dict[str, Any]:
        """The run config of this cell (the sections of ``recipes/*.yaml``); ``reward_model``: the folder of
        the model reward of a ``p2t`` cell (:func:`tiny_reward_model`; default ``<out>/rm``)."""
        trl: dict[str, Any] = {
            "output_dir": str(out),
            "max_steps": STEPS,
            "num_iterations": 2,  # two optimizer steps per batch: TRL runs the old-log-prob pass, reused
            "per_device_train_batch_size": 8,
            "num_generations": 4,
            "max_completion_length": 8,
            "learning_rate": 1e-3,
            "logging_steps": 1,
            "save_strategy": "no",
            "report_to": [],
            "disable_tqdm": True,
            "use_cpu": device == "cpu",
            "bf16": self.precision == "bf16",
            "fp16": self.precision == "fp16",
            "seed": 0,
            "ddp_timeout": 120,  # a collective mismatch fails the cell in 2 minutes instead of hanging
        }
        if self.adapter == "lora":
            trl["beta"] = 0.04  # TRL's KL term: its reference is the policy with the adapter disabled
        if self.engine == "fsdp2":
            trl["fsdp"] = "full_shard auto_wrap"
            trl["fsdp_config"] = {
                "fsdp_version": 2,
                "transformer_layer_cls_to_wrap": ["Qwen2DecoderLayer"],
                "reshard_after_forward": True,
            }
        if self.engine == "zero3":
            trl["deepspeed"] = {
                "zero_optimization": {"stage": 3},
                "bf16": {"enabled": "auto"},
                "fp16": {"enabled": "auto"},
                "train_micro_batch_size_per_gpu": "auto",
                "gradient_accumulation_steps": "auto",
                "gradient_clipping": "auto",
            }
        cfg: dict[str, Any] = {
            "model": {
                # untied head (as Qwen2.5-7B): FSDP2 cannot shard a head copy (LoRA's modules_to_save)
                # tied to the input embedding
                "tiny": {"hidden_size": 32, "num_layers": 2, "tie_embeddings": False, "seed": 0},
                "dtype": "bfloat16" if self.precision == "bf16-weights" else "auto",
            },
            "task": {"name": "toy", "options": {"size": 64, "seed": 0}},
            "data": {"split": "train", "limit": 64},
            "method": {"method": "gdpo", "credit": self.credit},
            "loss": {"name": self.loss},
            "replay": {"sharding": self.sharding},
            "trl": trl,
        }
        if self.credit == "p2t":  # a model reward beside the five rule rewards: its credit from its gradient
            cfg["task"]["options"]["model_rewards"] = [
                {
                    "name": "rm",
                    "model": str(reward_model or Path(out) / "rm"),
                    "rubric": "use every word asked for",
                    "device": "cpu" if device == "cpu" else "auto",
                    "dtype": "float32",
                }
            ]
        if self.adapter == "lora":
            cfg["peft"] = {
                "r": 4,
                "lora_alpha": 8,
                "target_modules": ["q_proj", "v_proj"],
                "modules_to_save": ["lm_head"],
                "init_lora_weights": False,
            }
        return cfg


def tiny_reward_model(folder: str | Path) -> str:
    """A tiny float32 sequence classifier (one logit) saved with its own byte-level BPE tokenizer (other token
    boundaries than the policy's): the model reward of the ``p2t`` cells. Returns the folder; builds it when
    it has no model yet. Call it before the processes start (:func:`run` does): under an initialised process
    group transformers' ``save_pretrained`` writes the model on rank 0 only."""
    from mrtpo.models.tiny import build_bpe_tokenizer, build_classifier
    from mrtpo.tasks.toy.data import toy_words

    folder = Path(folder)
    if not (folder / "model.safetensors").exists():
        tok = build_bpe_tokenizer([" ".join(toy_words()), "use every word asked for"], merges=24)
        build_classifier(len(tok), seed=5).save_pretrained(folder)
        tok.save_pretrained(folder)
    return str(folder)


def all_cells(engines: tuple[str, ...] = ENGINES) -> list[Cell]:
    return [
        Cell(e, p, a, c, loss) for e in engines for p in PRECISIONS for a in ADAPTERS for c, loss in CREDITS
    ]


def subset(engines: tuple[str, ...] = ENGINES) -> list[Cell]:
    """The representative subset (the CI test's): per engine one cell per credit/loss value, their
    precisions and adapters rotated so that each engine sees every precision and both adapters, and
    across the four engines every (precision, credit/loss) pair and every (adapter, credit/loss) pair
    appears."""
    out = []
    for e in engines:
        shift = ENGINES.index(e)
        for i, (c, loss) in enumerate(CREDITS):
            p = PRECISIONS[(i + shift) % len(PRECISIONS)]
            a = ADAPTERS[(i + shift) % len(ADAPTERS)]
            out.append(Cell(e, p, a, c, loss))
    return out


# --------------------------------------------------------------------------------------------------
# The worker (one launch per engine)
# --------------------------------------------------------------------------------------------------


def _force_fsdp_on_cpu() -> None:
    """accelerate enables FSDP on GPUs only (its state ignores the FSDP plugin for a CPU run); FSDP2 itself
    runs on gloo, so on CPU the matrix sets the distributed type accelerate would set on a GPU."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    if getattr(AcceleratorState, "_mrtpo_fsdp_cpu", False):
        return
    init = AcceleratorState.__init__

    def patched(self, *a, **kw):
        init(self, *a, **kw)
        plugin = kw.get("fsdp_plugin")
        if plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            # every AcceleratorState() refreshes its fields from PartialState's: set it there too
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = plugin
            if self._mixed_precision != "no":
                plugin.set_mixed_precision(self._mixed_precision)

    AcceleratorState.__init__ = patched
    AcceleratorState._mrtpo_fsdp_cpu = True


def _reset_accelerate() -> None:
    """A fresh accelerate state for the next cell (its mixed precision and plugins), keeping the process
    group."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()


def _rank() -> int:
    """This process's rank (torchrun's RANK: known before the trainer initialises the process group)."""
    return int(os.environ.get("RANK", "0"))


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return f"{type(e).__name__}: {text}"[:400]


def _naive_js(z_p, z_q):
    """``sqrt(JSD_2(softmax z_p, softmax z_q))`` per row, float64, written out: ``[T, V] -> [T]``."""
    import torch

    p, q = torch.softmax(z_p.double(), -1), torch.softmax(z_q.double(), -1)
    m = 0.5 * (p + q)
    kl_p = torch.where(p > 0, p * (p / m).log2(), torch.zeros_like(p)).sum(-1)
    kl_q = torch.where(q > 0, q * (q / m).log2(), torch.zeros_like(q)).sum(-1)
    return (0.5 * kl_p + 0.5 * kl_q).clamp(min=0).sqrt()


class _Checker:
    """Wraps a trainer's replay, CoRT and OPSD seams: after each, recomputes the values naively on a float32
    copy of the weights the trainer used and records the largest error against the precision's bound."""

    def __init__(self, trainer, cell: Cell, make_reference) -> None:
        self.tr, self.cell, self.make_reference = trainer, cell, make_reference
        self.records: list[dict[str, float]] = []
        self.replays = 0
        self.batches = 0
        self._wrap()

    # weights ---------------------------------------------------------------------------------------

    def _full_state(self) -> dict[str, Any]:
        """The policy's full parameters and buffers as float32 CPU tensors (collective when sharded)."""
        import torch

        from mrtpo.head import zero3_param

        model = self.tr._unwrapped()
        params = list(model.parameters())
        ctx = contextlib.nullcontext()
        if any(zero3_param(p) for p in params):
            import deepspeed

            ctx = deepspeed.zero.GatheredParameters(params, modifier_rank=None)
        with ctx, torch.no_grad():
            out = {}
            for k, v in model.state_dict().items():
                if hasattr(v, "full_tensor"):
                    v = v.full_tensor()
                out[k] = v.detach().float().cpu().clone()
        return out

    def _reference(self):
        """(fp64 reference model, cell-precision reference model) on the current weights."""
        import torch

        state = self._full_state()
        ref = self.make_reference()
        missing, unexpected = ref.load_state_dict(state, strict=False)
        bad = [k for k in missing if "lm_head" not in k] + list(unexpected)
        if bad:
            raise RuntimeError(f"matrix: reference weights do not match the policy's: {bad[:4]}")
        exact = ref.double().eval()
        cell = self.make_reference()
        cell.load_state_dict(state, strict=False)
        cell.eval()
        if self.cell.precision in ("bf16-weights",) or (
            self.cell.precision in ("bf16", "fp16") and self.cell.engine in ("fsdp2", "zero3")
        ):
            cell = cell.to(torch.bfloat16 if "bf16" in self.cell.precision else torch.float16)
        return exact, cell.to(self.device)  # the cell's precision on the cell's device (its kernels)

    @property
    def device(self):
        return self.tr.accelerator.device

    def _autocast(self):
        import torch

        if self.cell.precision in ("bf16", "fp16") and self.cell.engine in ("single", "ddp"):
            dtype = torch.bfloat16 if self.cell.precision == "bf16" else torch.float16
            return torch.autocast(device_type=self.device.type, dtype=dtype)
        return contextlib.nullcontext()

    def _logits(self, exact, cell, context, response):
        """float64 [T, V] logits of the exact model (CPU, float64) and of the cell-precision model at the
        positions that predict each response token."""
        import torch

        ids = torch.tensor([[*context, *response[:-1]]])
        start = len(context) - 1
        with torch.no_grad():
            z = exact(input_ids=ids).logits[0, start:].double()
            with self._autocast():
                zc = cell(input_ids=ids.to(self.device)).logits[0, start:].double().cpu()
        return z, zc

    # checks ----------------------------------------------------------------------------------------

    @staticmethod
    def _bound(delta: float) -> float:
        from mrtpo.distance import js_error_bound  # torch: imported by the worker only (the CLI stays light)

        return js_error_bound(delta)

    def _record(self, kind: str, err: float, bound: float, delta: float) -> None:
        self.records.append({"kind": kind, "err": err, "bound": bound, "delta": delta})

    def _check_distances(self, scored, d, replayed, mode: str) -> None:
        exact, cell = self._reference()
        contexts = self.tr._contexts(scored.examples)
        replayed = replayed.cpu()
        for j, ctx in enumerate(contexts):
            resp = scored.completion_ids[j]
            if not resp:
                continue
            others = list(ctx.leave_one_out) if mode == "reward" else [ctx.joint]
            zp, zpc = self._logits(exact, cell, ctx.full, resp)
            for k, other in enumerate(others):
                if not replayed[j, k]:
                    continue
                zq, zqc = self._logits(exact, cell, other, resp)
                ref = _naive_js(zp, zq)  # [T]
                delta = max((zp - zpc).abs().max().item(), (zq - zqc).abs().max().item())
                got = d[j, k, : len(resp)].double().cpu()
                self._record(mode, (got - ref).abs().max().item(), self._bound(delta) + SLACK, delta)

    def _check_cort(self, scored, rel, replayed) -> None:
        import torch

        exact, cell = self._reference()
        tau = float(self.tr.temperature)
        contexts = self.tr._contexts(scored.examples)
        replayed = replayed.cpu()
        for j, ctx in enumerate(contexts):
            resp = scored.completion_ids[j]
            if not resp or not replayed[j, 0]:
                continue
            tok = torch.tensor(resp)[:, None]
            zc, zcc = self._logits(exact, cell, ctx.full, resp)
            zj, zjc = self._logits(exact, cell, ctx.joint, resp)
            lp = torch.log_softmax(zc / tau, -1).gather(-1, tok)[:, 0]
            lq = torch.log_softmax(zj / tau, -1).gather(-1, tok)[:, 0]
            ref = (lp - lq).abs()
            delta = max((zc - zcc).abs().max().item(), (zj - zjc).abs().max().item())
            got = rel[j, 0, : len(resp)].double().cpu()
            self._record("cort", (got - ref).abs().max().item(), 4 * delta / tau + SLACK, delta)

    def _check_attributed(self, scored, w, attributed, adv_local, skipped=None) -> None:
        """P2T's rows: exactly the model reward's active pairs but those whose response no scorer token covers
        (skipped, reason ``uncovered``: replayed instead; an attribution that failed fails the cell), each
        averaging 1 over its response."""
        import torch

        k = self.tr.reward_names.index("rm")
        active = adv_local.abs().cpu() > 1e-8  # [B, K]
        attributed = attributed.cpu()
        skipped = torch.zeros_like(attributed, dtype=torch.int8) if skipped is None else skipped.cpu()
        if bool((skipped > 1).any()):  # 2: the attribution raised
            self._record("p2t", 1.0, 0.0, 0.0)
            return
        want = active & (torch.arange(active.shape[1]) == k) & (skipped == 0)  # [B, K]
        if not bool((attributed == want).all()):
            self._record("p2t", 1.0, 0.0, 0.0)  # the wrong pairs were attributed: the cell fails
            return
        for j in range(w.shape[0]):
            n = len(scored.completion_ids[j])
            if attributed[j, k] and n:
                mean = w[j, k, :n].double().mean().item()
                self._record("p2t", abs(mean - 1.0), SLACK, 0.0)

    def _check_opsd(self, inputs, div) -> None:
        import torch

        exact, cell = self._reference()
        tau = float(self.tr.temperature)
        comp, cmask = inputs["completion_ids"].cpu(), inputs["completion_mask"].cpu()
        for j in range(comp.shape[0]):
            resp = comp[j][cmask[j].bool()].tolist()
            if not resp:
                continue
            prompt = inputs["prompt_ids"][j][inputs["prompt_mask"][j].bool()].tolist()
            zs, zsc = self._logits(exact, cell, prompt, resp)  # student: the rollout prompt
            zt, ztc = self._logits(exact, cell, list(inputs["opsd_full_ids"][j]), resp)  # teacher: C
            logp, logq = torch.log_softmax(zt / tau, -1), torch.log_softmax(zs / tau, -1)
            m = torch.logsumexp(torch.stack([logp, logq]), 0) - math.log(2.0)
            ref = 0.5 * (logp.exp() * (logp - m)).sum(-1) + 0.5 * (logq.exp() * (logq - m)).sum(
                -1
            )  # [T] nats
            got = div[j, : len(resp)].double().cpu()
            # the JSD in nats is ln 2 d^2 (d the JS distance): |D' - D| = ln 2 |d' - d| (d' + d)
            # <= ln 2 B (2 d + B) with B the distance bound; plus float32 slack of the divergence (its
            # logarithms are not cancellation-free near 0)
            delta = max((zs - zsc).abs().max().item(), (zt - ztc).abs().max().item()) / tau
            b = self._bound(delta)
            d_ref = (ref.clamp(min=0) / math.log(2)).sqrt()
            bound = (math.log(2) * b * (2 * d_ref + b)).max().item() + OPSD_SLACK
            self._record("opsd", (got - ref).abs().max().item(), bound, delta)

    def _wrap(self) -> None:
        tr = self.tr
        replay, loss = tr._replay, tr._compute_loss

        def checked_replay(out, scored, adv_local, captured, kind):
            res = replay(out, scored, adv_local, captured, kind)
            self.replays += 1
            if kind == "logprob":
                self._check_cort(scored, res.distances, res.replayed)
            elif kind in ("reward", "joint"):
                self._check_distances(scored, res.distances, res.replayed, kind)
            elif kind == "gradient":  # p2t: the rule rows are replayed distances, the model reward's weights
                attributed = res.attributed.to(res.replayed.device)
                self._check_distances(scored, res.distances, res.replayed & ~attributed, "reward")
                self._check_attributed(scored, res.distances, attributed, adv_local, res.skipped)
            else:
                raise ValueError(f"the matrix has no float32 reference for replay kind {kind!r}")
            return res

        def checked_loss(model, inputs):
            value = loss(model, inputs)
            if tr.args.loss == "opsd":
                self.replays += 1
                self._check_opsd(inputs, tr.last_loss_terms["opsd_divergence"])
            return value

        generate = tr._generate_and_score_completions

        def counted_generate(inputs):
            self.batches += 1
            return generate(inputs)

        tr._replay, tr._compute_loss = checked_replay, checked_loss
        tr._generate_and_score_completions = counted_generate


def _run_cell(cell: Cell, out_dir: Path, device: str) -> dict[str, Any]:
    """Train one cell; its result on this process."""
    import copy

    from mrtpo.integrations.trl.recipe import build_trainer, load_config

    res: dict[str, Any] = {"cell": cell.name, "rank": _rank()}
    t0 = time.perf_counter()
    try:
        _reset_accelerate()
        rm = None
        if cell.credit == "p2t":  # built by run() before the launch (save_pretrained writes on rank 0 only)
            rm = tiny_reward_model(out_dir.parent / "rm")
        config = load_config(raw=cell.config(out_dir / cell.name.replace("/", "_"), device, rm))
        tr = build_trainer(config)
    except Exception as e:  # refused at start: config validation, TRL, accelerate or the engine
        res.update(status="refused", reason=_one_line(e), seconds=time.perf_counter() - t0)
        return res
    base = tr._unwrapped()
    base = base.get_base_model() if hasattr(base, "get_base_model") else base
    lora = config.peft_config()

    def make_reference():
        import torch

        from mrtpo.models.tiny import build_model

        m = build_model(base.config.vocab_size, dtype=torch.float32, **config.model["tiny"])
        if lora is not None:
            from peft import get_peft_model

            m = get_peft_model(m, copy.deepcopy(lora))
        return m

    checker = _Checker(tr, cell, make_reference)
    try:
        tr.train()
    except Exception as e:
        # before the first batch: the engine's setup refused the configuration (accelerate, DeepSpeed,
        # FSDP2 wrapping), with its own message
        started = checker.batches > 0
        res.update(status="failed" if started else "refused", reason=_one_line(e),
                   trace=traceback.format_exc()[-3000:])  # fmt: skip
    else:
        res["status"] = "ok"
    res["steps"] = int(tr.state.global_step)
    res["checked_calls"] = checker.replays
    res["values"] = len(checker.records)
    if checker.records:
        worst = max(checker.records, key=lambda r: r["err"] - r["bound"])
        res["max_err"] = max(r["err"] for r in checker.records)
        res["max_delta"] = max(r["delta"] for r in checker.records)
        res["worst"] = worst
        res["within_bound"] = all(r["err"] <= r["bound"] for r in checker.records)
    res["seconds"] = time.perf_counter() - t0
    if res["status"] == "ok" and res["steps"] < STEPS:
        res.update(status="failed", reason=f"trained {res['steps']} of {STEPS} steps")
    elif res["status"] == "ok" and not res.get("within_bound", True):
        res.update(status="failed", reason=f"replay outside its bound: {res['worst']}")
    elif res["status"] == "ok" and cell.credit != "none" and not checker.records:
        res.update(status="failed", reason="no replayed value was checked")
    return res


def worker(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m mrtpo.integrations.trl.matrix worker")
    p.add_argument("--cells", required=True, help="comma-separated cell names of one engine")
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    a = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    cells = [Cell.parse(c) for c in a.cells.split(",") if c]
    if a.device == "cpu" and any(c.engine == "fsdp2" for c in cells):
        _force_fsdp_on_cpu()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for cell in cells:
        res = _run_cell(cell, out, a.device)
        results.append(res)
        append_jsonl(out / f"rank{res['rank']}.jsonl", [res])
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()  # left to the exit, a rank can abort after its results
    return 0


# --------------------------------------------------------------------------------------------------
# The launcher and the table
# --------------------------------------------------------------------------------------------------


def launch_env(engine: str, device: str, base: dict[str, str]) -> dict[str, str]:
    """The environment of one engine's launch, from the caller's ``base`` environment."""
    env = {
        **base,
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    if device == "cpu" and engine != "zero3":
        env["ACCELERATE_USE_CPU"] = "true"  # gloo (accelerate turns DeepSpeed off when it is set)
    if engine == "zero3":
        # accelerate turns DeepSpeed off when ACCELERATE_USE_CPU is set (by a caller such as
        # scripts/gpu_check.sh --device cpu): the ZeRO-3 launch must not inherit it
        env.pop("ACCELERATE_USE_CPU", None)
        if device == "cpu":
            env["DS_ACCELERATOR"] = "cpu"  # DeepSpeed's CPU accelerator (gloo)
    return env


def _launch(engine: str, cells: list[Cell], out: Path, device: str, nproc: int, timeout: float,
            port: int | None = None) -> str:  # fmt: skip
    """Run ``cells`` of one engine in one launch; returns the launcher's last output lines. The processes
    rendezvous on ``port``, or on a free port torchrun picks (:mod:`mrtpo.integrations.ports`)."""
    from mrtpo.integrations.ports import torchrun_rendezvous

    env = launch_env(engine, device, dict(os.environ))
    args = ["-m", "mrtpo.integrations.trl.matrix", "worker", "--cells", ",".join(c.name for c in cells),
            "--out", str(out), "--device", device]  # fmt: skip
    if engine == "single":
        cmd = [sys.executable, *args]
    else:  # torchrun through this interpreter (its environment's packages, whichever is on PATH)
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            *torchrun_rendezvous(port, "--port"),
            f"--nproc_per_node={nproc}",
            *args,
        ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
        tail = (proc.stdout + proc.stderr)[-4000:]
    except subprocess.TimeoutExpired as e:
        tail = f"timed out after {timeout:.0f} s: {(e.stderr or b'')[-2000:]!r}"
    return tail


def run(cells: list[Cell], out: Path, *, device: str = "cpu", nproc: int = 2, timeout: float = 1800,
        progress: bool = True, port: int | None = None) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Run the cells (one launch per engine) and merge the processes' results: a cell passes when every
    process trained and checked it. ``port``: the multi-process launches' rendezvous port (default: a
    free one each)."""
    merged: dict[str, dict[str, Any]] = {}
    if any(c.credit == "p2t" for c in cells):  # the model reward of the p2t cells, shared by every launch
        tiny_reward_model(out / "rm")
    for engine in ENGINES:
        mine = [c for c in cells if c.engine == engine]
        if not mine:
            continue
        t0 = time.perf_counter()
        if progress:
            print(f"matrix: {engine}: {len(mine)} cells ...", file=sys.stderr, flush=True)
        sub = out / engine
        tail = _launch(engine, mine, sub, device, 1 if engine == "single" else nproc, timeout, port)
        rows: dict[str, list[dict[str, Any]]] = {}
        for f in sorted(sub.glob("rank*.jsonl")):  # a process killed mid-line leaves a partial last line
            for r in read_jsonl(f, partial_last_line=True):
                rows.setdefault(r["cell"], []).append(r)
        for c in mine:
            rs = rows.get(c.name, [])
            want = 1 if engine == "single" else nproc
            if len(rs) < want:
                merged[c.name] = {"cell": c.name, "status": "failed",
                                  "reason": f"{len(rs)} of {want} processes reported; launcher: {tail[-600:]}"}  # fmt: skip
                continue
            status = "ok" if all(r["status"] == "ok" for r in rs) else (
                "refused" if all(r["status"] == "refused" for r in rs) else "failed")  # fmt: skip
            first_bad = next((r for r in rs if r["status"] != "ok"), rs[0])
            merged[c.name] = {
                "cell": c.name,
                "status": status,
                "reason": first_bad.get("reason", ""),
                "steps": min(r.get("steps", 0) for r in rs),
                "values": sum(r.get("values", 0) for r in rs),
                "max_err": max((r.get("max_err", 0.0) for r in rs), default=0.0),
                "max_delta": max((r.get("max_delta", 0.0) for r in rs), default=0.0),
                "seconds": max(r.get("seconds", 0.0) for r in rs),
            }
        if progress:
            print(f"matrix: {engine}: done in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return merged


def table(results: dict[str, dict[str, Any]]) -> str:
    """One line per cell: status, steps, values checked, largest error and logit difference."""
    head = f"{'cell':34s} {'result':8s} {'steps':>5s} {'checked':>7s} {'max |err|':>10s} {'max δ':>9s}  note"
    lines = [head, "-" * len(head)]
    for name, r in results.items():
        note = r.get("reason", "") if r["status"] != "ok" else ""
        lines.append(
            f"{name:34s} {r['status']:8s} {r.get('steps', 0):5d} {r.get('values', 0):7d} "
            f"{r.get('max_err', 0.0):10.2e} {r.get('max_delta', 0.0):9.2e}  {note[:160]}"
        )
    ok = sum(r["status"] == "ok" for r in results.values())
    refused = sum(r["status"] == "refused" for r in results.values())
    lines.append(f"{ok} trained within bound, {refused} refused at start, "
                 f"{len(results) - ok - refused} failed, of {len(results)} cells")  # fmt: skip
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    p.add_argument("--full", action="store_true", help="every cell (default: the representative subset)")
    p.add_argument("--cells", nargs="+", default=None, help="explicit cells, ENGINE/PRECISION/ADAPTER/CREDIT")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--nproc", type=int, default=2, help="processes of the multi-process engines (default 2)")
    p.add_argument("--out", default=None, help="results folder (default: a temporary one)")
    p.add_argument("--json", default=None, help="write the merged results here")
    p.add_argument(
        "--port", type=int, default=None, help="rendezvous port of the launches (default: a free one)"
    )


def run_from_args(a: argparse.Namespace) -> int:
    engines = tuple(a.engines)
    cells = (
        [Cell.parse(c) for c in a.cells] if a.cells else (all_cells(engines) if a.full else subset(engines))
    )
    out = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="mrtpo-matrix-"))
    if a.port is not None and any(c.engine != "single" for c in cells):
        from mrtpo.integrations.ports import check_port

        check_port(a.port, "--port")  # a taken port is one line before any cell runs
    results = run(cells, out, device=a.device, nproc=a.nproc, port=a.port)
    print(table(results))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0 if all(r["status"] != "failed" for r in results.values()) else 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["worker"]:
        return worker(argv[1:])
    p = argparse.ArgumentParser(prog="mrtpo matrix", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run_from_args(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
