"""MRTPO on TRL: :class:`MRTPOTrainer` (a ``GRPOTrainer``) configured by :class:`~mrtpo.integrations.trl.config.MRTPOConfig`.

Adapted to ``trl>=1.14,<1.17`` (tested with 1.14.2, 1.15.0 and 1.16.0). TRL does the generation (transformers or vLLM), the old/reference
log-probabilities, the clipped surrogate, gradient accumulation and the processes. The subclass only
changes three seams:

1. ``_calculate_rewards``: scores each response with the task's verifier objects (docs/design.md §4),
   applies the policy for failed verdicts (``verifier_policy``, :mod:`mrtpo.tasks.faults`) and keeps
   the gathered reward matrix ``[N, K]`` (all processes);
2. ``_generate_and_score_completions``: after TRL's own pass, replaces TRL's advantages with those
   of the core's credit step, ``mrtpo.step.credit_step``: ``Â = mrtpo.advantages.compute(method,
   rewards [N, K], group_ids [N]) -> [N, K]``, this process's rows, the replay the credit scheme asks
   for (:meth:`MRTPOTrainer._replay` hands the core's :func:`mrtpo.replay.for_scheme` TRL's batch, its
   rollout pass and its sharding) and the allocation, handing TRL's loss advantages ``[B, T]``; with a response-level scheme
   (``credit="none"``) TRL gets the row sums ``[B]``;
3. ``_compute_loss``: only for the OPSD baseline (``loss="opsd"``), a self-distillation divergence
   (``mrtpo.losses``) instead of the policy-gradient surrogate.

With vLLM (``use_vllm``) TRL's importance-sampling correction multiplies every token's term, token
advantages included; what mrtpo does there: :mod:`mrtpo.integrations.trl.vllm`.

Baselines (docs/design.md §6; the papers' code is not public, these are this project's choices):

- **OPSD** (``loss="opsd"``): teacher = the policy on the full context ``C`` (privileged segments
  included), under ``torch.no_grad`` with the current weights at each micro-batch; student = the policy
  on the rollout prompt (TRL's prompt ids) with gradient; per-token generalized JSD (``opsd_beta``,
  default 0.5) or forward KL(teacher || student) over the full vocabulary at the sampling temperature
  (logits / ``temperature``, as TRL's log-probabilities), on the sampled response tokens; loss =
  token mean over the micro-batch / gradient-accumulation steps. Rewards are scored and logged but do
  not enter the loss. Examples without privileged segments make teacher = student (loss 0; a warning
  is logged once).
- **CoRT** (``credit="cort"``): joint replay (``C`` and ``C_-all``) with relevance
  ``|log pi(y_t | C) - log pi(y_t | C_-all)|`` of the sampled token at the sampling temperature, used as
  the single shared distance row of ``mrtpo.credit.allocate`` on the response advantage of
  ``method.method`` (use ``grpo`` for the paper's setting): ``S = A ((1 - b_s) + b_s rel / mean rel)``
  with ``b_s = credit_beta * min(1, step / ramp_steps)`` (linear ramp from 0; ``method.ramp_steps``).
- **RLSD** (``credit="rlsd"``, :func:`mrtpo.credit.rlsd_token_advantages`): teacher = the policy on
  ``C``, student = the policy on the rollout prompt (both passes run by replay, replay kind
  ``teacher_gap``; TRL's old log-probabilities are not read); gap ``log pi(y_t | C) - log pi(y_t |
  rollout)`` of the sampled tokens at the sampling temperature, only for responses whose response
  advantage is not 0 and whose C has privileged segments (elsewhere teacher = student: weight 1);
  ``S = A ((1 - l) + l clip(exp(sign(A) gap), 1 - eps, 1 + eps))`` with ``l`` the ``credit_beta``
  scheduled by the ``warmup_steps`` / ``decay_steps`` of ``method.credit_options``
  (:func:`mrtpo.credit.rlsd_lambda`).

Conditioned rewards (GDPO Eq. 8): a task wrapped by :class:`mrtpo.tasks.conditions.ConditionedTask`
(the task option ``conditions``) has its reward matrix conditioned right after scoring, before any
advantage; ``conditions/<reward>/{raw, conditioned, met}`` are logged beside TRL's ``rewards/*``.

Reuse of the rollout pass: when TRL runs its old-log-probability pass (``gradient_accumulation_steps``
not a multiple of ``steps_per_generation * num_iterations``, or vLLM importance sampling) and the
replay kind can use it (:attr:`mrtpo.replay.ReplayKind.reuses_rollout`: every kind whose compared
context is not the rollout prompt itself, a user's kind included), a forward hook on the decoder body
keeps its last hidden states, and replay does not run ``C`` again for responses whose full context
equals the rollout prompt (CoRT's log-probabilities under ``C`` come from those hidden states too).
Otherwise replay runs ``C`` itself (1 FPE). The hidden states are reused only when that pass
is deterministic (no dropout; TRL runs it in training mode) and in the precision replay computes in
(the parameters' dtype, or FSDP2's mixed-precision ``param_dtype`` whose master weights stay float32; an
autocast to another dtype turns reuse off), so they equal what replay would compute.

Parameter sharding (FSDP2, FSDP1, DeepSpeed ZeRO-3), where every forward is collective:
``replay_sharding`` (default ``auto``, see :mod:`mrtpo.integrations.trl.sharding`) makes replay gather the
parameters once (``gather``) or run the same number of forwards on every process (``lockstep``); the
CoRT passes run on the same number of rows everywhere (active rows padded with inactive ones); the OPSD
teacher runs one forward per micro-batch on every process and gathers a sharded head weight, and the
OPSD student takes its logits from the model's own forward (the engine gathers the head and reduces its
gradient).

Precision: every pass runs in the policy's own precision (accelerate's autocast for TRL's ``bf16`` /
``fp16``, bfloat16 weights, FSDP2's mixed precision, DeepSpeed's bf16), the vocabulary projections in
float32 (:mod:`mrtpo.replay`, docs/scale.md: the error bound against float32). PEFT: replay, CoRT and
OPSD use the adapted policy; TRL's reference pass of a PEFT policy (the adapter disabled) is never
reused as the rollout pass. The configuration matrix (:mod:`mrtpo.integrations.trl.matrix`) trains every
combination and checks it against float32.

Notation: N responses in the gathered batch, B local responses, K rewards, T response tokens.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from typing import Any

import torch
from accelerate.utils import gather, gather_object
from trl import GRPOTrainer
from trl.trainer.utils import RepeatSampler

from mrtpo import advantages as adv_mod
from mrtpo import replay as replay_mod
from mrtpo.head import autocast_dtype, head_of
from mrtpo.integrations.trl import checkpoints as checkpoints_mod
from mrtpo.integrations.trl import data as data_mod
from mrtpo.integrations.trl import serve as serve_mod
from mrtpo.integrations.trl import sharding as sharding_mod
from mrtpo.integrations.trl import vllm as vllm_mod
from mrtpo.integrations.trl.config import MRTPOConfig
from mrtpo.integrations.trl.credit_audit import CreditAudit
from mrtpo.integrations.trl.passes import response_hidden
from mrtpo.integrations.trl.run_logging import (
    SAMPLES_JSONL,
    JSONLMetricsCallback,
    append_jsonl,
    write_run_json,
)
from mrtpo.losses import (
    distill_divergence_from_hidden,
    distill_divergence_from_logits,
    masked_token_mean,
)
from mrtpo.prompt import has_privileged
from mrtpo.step import credit_step
from mrtpo.step_log import LocalResponse as StepResponse
from mrtpo.step_log import StepLog
from mrtpo.tasks import faults as faults_mod
from mrtpo.tasks import model_reward as model_reward_mod
from mrtpo.tasks.base import Example, Task
from mrtpo.tasks.conditions import condition_metrics, task_conditions
from mrtpo.tasks.model_reward import prepare_model_rewards

logger = logging.getLogger(__name__)


def _has_dropout(model) -> bool:
    """True when a forward in training mode is random (dropout modules or attention dropout > 0): then the
    rollout pass's hidden states are not those of a no-grad eval replay and are not reused."""
    cfg = getattr(model, "config", None)
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    if float(getattr(text, "attention_dropout", 0.0) or 0.0) > 0:
        return True
    return any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())


def _adapters_disabled(model) -> bool:
    """True inside PEFT's ``disable_adapter()`` (TRL's reference pass of a PEFT policy)."""
    if not hasattr(model, "peft_config"):
        return False
    return any(getattr(m, "_disable_adapters", False) for m in model.modules())


class EpochRepeatSampler(RepeatSampler):
    """TRL's ``RepeatSampler`` whose permutation is a function of (seed, epoch).

    TRL's sampler draws each epoch's permutation from one generator seeded once, so the order of epoch
    ``e`` depends on how many times the sampler was iterated before. A resumed run builds a fresh
    sampler and, in epoch ``e >= 1``, would replay epoch 0's order. Here the Trainer's ``set_epoch``
    (called before every epoch, including the resumed one) fixes the epoch, and iterating reseeds the
    generator and skips the permutations of the earlier epochs: the same order as an uninterrupted TRL
    run, whether or not the run was resumed.
    """

    epoch: int = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self):
        if self.shuffle and self.seed is not None:
            self.generator.manual_seed(self.seed)
            for _ in range(self.epoch):
                torch.randperm(self.num_samples, generator=self.generator)
        return super().__iter__()


def _reward_column(name: str):
    """A named placeholder reward function: TRL needs K named reward functions; scoring happens in
    :meth:`MRTPOTrainer._calculate_rewards` through the verifier objects."""

    def column(prompts=None, completions=None, **kwargs):
        raise RuntimeError(f"reward {name!r} is scored by MRTPOTrainer._calculate_rewards")

    column.__name__ = name
    return column


@dataclass
class _Scored:
    """What ``_calculate_rewards`` keeps for the rest of the step (local rows unless said otherwise)."""

    examples: list[Example]
    texts: list[str]
    completion_ids: list[list[int]]
    rewards: torch.Tensor  # [N, K] gathered over processes (conditioned when the task has conditions)
    verifiers: list[list[Any]]  # [B][K]
    raw: torch.Tensor | None = None  # [N, K] the rewards before conditioning (None: no conditions)


TRL_SEAMS = (
    "_calculate_rewards",
    "_get_per_token_logps_and_entropies",
    "_generate_and_score_completions",
    "_compute_loss",
    "_get_train_sampler",
    "_issue_warnings_after_load",
)
"""Every private method of TRL's ``GRPOTrainer`` (and the transformers ``Trainer`` below it) that
:class:`MRTPOTrainer` overrides (the test of the supported TRL versions checks that each exists with
the arguments the override forwards, and that no other private method is overridden): the rewards
(seam 1), the capture of the rollout pass, the advantages (seam 2), the OPSD loss (seam 3), the
resumable sampler and the resume warnings (tied weights are not missing keys)."""


class MRTPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` with verifier rewards, the advantage registry, token credit and the baselines.

    Args:
        model: a model instance or a local path / hub id (as ``GRPOTrainer``).
        args: :class:`MRTPOConfig`.
        task: the task whose ``verifiers(example)`` score every response; ``task.reward_names`` are the K
            reward columns.
        train_dataset: a list of :class:`~mrtpo.tasks.base.Example` or a dataset with ``prompt`` and
            ``example`` columns (:func:`mrtpo.integrations.trl.data.examples_to_dataset`).
        eval_dataset: same forms, optional.
        processing_class: the tokenizer (left padding; a chat template).
        run_info: extra keys for ``run.json`` (model name, config file, ...).
        verifier_policy: what a failed verdict does (:class:`mrtpo.tasks.faults.VerifierPolicy`; default:
            stop the run, naming the verifier, the example and the cause). Under ``on_error="min"`` it
            scores the reward's minimum and is counted in ``verifier_errors/<reward>``.
        **kwargs: passed to ``GRPOTrainer`` (callbacks, optimizers, peft_config, ...); ``reward_funcs``
            is not accepted (the verifiers are the rewards).

    After each generation, :attr:`last_batch` holds the batch's rewards ``[N, K]``, the advantages
    ``[N, K]``, TRL's own local advantages ``[B]`` (from its ``multi_objective_aggregation``), the local
    token advantages ``[B, T]``, distances ``[B, K', T]``, the rows replayed and those holding token weights
    (``attributed``) ``[B, K']`` (tensors where
    the step left them: on the accelerator's device), and the local examples, response texts and response
    token ids: the hook the demo and tests inspect.
    """

    def __init__(
        self,
        model,
        args: MRTPOConfig,
        task: Task,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        run_info: dict[str, Any] | None = None,
        verifier_policy: faults_mod.VerifierPolicy | None = None,
        **kwargs,
    ):
        if "reward_funcs" in kwargs:
            raise ValueError("MRTPOTrainer takes a task (verifier objects), not reward_funcs")
        if not isinstance(args, MRTPOConfig):
            raise ValueError(f"args must be an MRTPOConfig, got {type(args).__name__}")
        if not isinstance(task, Task):
            raise ValueError(f"task must be a mrtpo Task, got {type(task).__name__}")
        self.task = task
        self.reward_names = list(task.reward_names)
        self.verifier_policy = verifier_policy or faults_mod.VerifierPolicy()
        train_dataset = data_mod.as_dataset(train_dataset)
        eval_dataset = data_mod.as_dataset(eval_dataset)
        if train_dataset is None:
            raise ValueError("train_dataset is required")
        first = data_mod.example_from_row(train_dataset[0])
        vs = task.verifiers(first)
        if [v.name for v in vs] != self.reward_names:
            raise ValueError(
                f"task.verifiers(example {first.id!r}) returns {[v.name for v in vs]}; expected the reward columns "
                f"{self.reward_names}"
            )
        self.reward_bounds = [tuple(float(b) for b in v.bounds) for v in vs]
        prepare_model_rewards(vs, first)  # model rewards loaded and checked now, before the first generation
        self._judge_columns = model_reward_mod.judge_columns(vs)  # their P(yes or no) logged per step
        self.conditions = task_conditions(task)  # GDPO's conditioned rewards (mrtpo.tasks.conditions)
        if self.conditions:
            self.reward_bounds = task.bounds(self.reward_bounds)
        self._bounds = torch.tensor(self.reward_bounds, dtype=torch.float32)  # [K, 2]
        # what the configuration alone cannot check, checked now against the task, naming the field
        args.method.check_rewards(len(self.reward_names), self.reward_names, self.reward_bounds)
        kind = args.method.scheme.kind  # whether the task suits the scheme's replay kind: its own answer
        for line in (
            []
            if kind is None
            else kind.check_task(vs, first, credit=args.method.credit, field="method.credit")
        ):
            logger.warning(line)
        if args.loss == "opsd" and not has_privileged(first.segments):
            logger.warning(
                "OPSD: example %r has no privileged segment, so the teacher context equals the rollout prompt "
                "and the distillation loss is 0 for it",
                first.id,
            )
        # vLLM's CPU build: colocate's engine dtype and weight sync; server mode's weights through a file
        with vllm_mod.cpu_build_colocate(self), serve_mod.disk_sync_on_cpu():
            super().__init__(
                model=model,
                reward_funcs=[_reward_column(n) for n in self.reward_names],
                args=args,
                train_dataset=train_dataset,
                eval_dataset=eval_dataset,
                processing_class=processing_class,
                **kwargs,
            )
        self._scored: _Scored | None = None
        self._captured: list[torch.Tensor] | None = None
        self._reuse_ok = not _has_dropout(self._unwrapped())
        self._sharding: str | None = None  # resolved at the first replay (the model is wrapped by then)
        self._warned_identical = False
        self._audit = CreditAudit(self.reward_names)
        if hasattr(task, "attach_policy"):  # judges of model rewards that are the policy itself
            task.attach_policy(self._unwrapped(), processing_class)
        self.last_batch: dict[str, Any] = {}
        self.last_loss_terms: dict[str, torch.Tensor] = {}
        self.run_info = dict(run_info or {})
        self.add_callback(checkpoints_mod.schedule_resync_callback())  # resume with a new max_steps
        if args.run_files:
            self.add_callback(JSONLMetricsCallback(args.output_dir))
            if self.accelerator.is_main_process:
                write_run_json(args.output_dir, self._run_json())

    # ------------------------------------------------------------------ setup helpers

    def _run_json(self) -> dict[str, Any]:
        a, mc = self.args, self.args.method
        model = getattr(getattr(self.model, "config", None), "_name_or_path", None)
        info = {
            "task": getattr(self.task, "name", type(self.task).__name__),
            "model": model,
            "method": mc.to_dict(),
            "method_label": adv_mod.ADVANTAGES.get(mc.method).label,  # the registry's display name
            "loss": a.loss,
            "seed": a.seed,
            "reward_names": self.reward_names,
            "reward_bounds": [list(b) for b in self.reward_bounds],
        }
        if self.conditions:
            info["conditions"] = {c.reward: [c.primary, c.threshold] for c in self.conditions}
        info.update(self.run_info)
        info["trl"] = {k: v for k, v in a.to_dict().items() if not k.startswith("_")}
        return info

    def create_model_card(self, model_name=None, *args, **kwargs):  # TRL's says "None" for a local model
        super().create_model_card(
            model_name or os.path.basename(os.path.abspath(self.args.output_dir)), *args, **kwargs
        )
        if self.is_world_process_zero():
            from mrtpo.integrations.trl.run_logging import name_base_model

            name_base_model(self.args.output_dir, self.model.config._name_or_path)

    def _unwrapped(self):
        return self.accelerator.unwrap_model(self.model)

    def _issue_warnings_after_load(self, load_result) -> None:
        """transformers' warnings after a resume, without tied weights counted as missing keys
        (``lm_head.weight`` of tied embeddings is the loaded embedding matrix)."""
        super()._issue_warnings_after_load(checkpoints_mod.without_tied_keys(self.model, load_result))

    def _get_train_sampler(self, dataset=None):
        """TRL's sampler, made resumable across epochs (:class:`EpochRepeatSampler`)."""
        base = super()._get_train_sampler(dataset)
        if type(base) is not RepeatSampler:
            return base
        return EpochRepeatSampler(
            data_source=base.data_source,
            mini_repeat_count=base.mini_repeat_count,
            batch_size=base.batch_size,
            repeat_count=base.repeat_count,
            shuffle=base.shuffle,
            seed=base.seed,
        )

    def _replay_sharding(self) -> str:
        """The replay sharding of this run ("none", "gather" or "lockstep"), resolved once (collective
        for ``auto`` under sharding: every process resolves at the same step) and logged."""
        if self._sharding is None:
            wrapped = getattr(self, "model_wrapped", None) or self.model
            mode, why = sharding_mod.resolve(self.args.replay_sharding, wrapped, self.accelerator.device)
            self._sharding = mode
            if self.accelerator.is_main_process:  # visible by default where it matters (sharded runs)
                (logger.info if mode == "none" else logger.warning)("replay sharding: %s (%s)", mode, why)
        return self._sharding

    # ------------------------------------------------------------------ seam 1: rewards

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        device = self.accelerator.device
        examples = [data_mod.example_from_row(x) for x in inputs]
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        verifiers = [self.task.verifiers(ex) for ex in examples]
        b = len(examples)
        # failed verdicts (None, NaN, inf, out of bounds, an exception, a timeout) hold the reward's
        # minimum; the policy then stops the run (scoring stops at that failure) or keeps and counts them
        n_all = b * self.accelerator.num_processes
        local, faults = faults_mod.score_batch(
            verifiers, examples, texts, self.reward_names, self.accelerator.process_index * b,
            policy=self.verifier_policy, verdicts=n_all * len(self.reward_names),
        )  # fmt: skip
        many = self.accelerator.num_processes > 1
        if many and int(gather(torch.tensor([len(faults)], device=device)).sum()):  # every process sees all
            faults = [f for part in gather_object([faults]) for f in part]
        faults_mod.apply_policy(faults, n_all * len(self.reward_names), self.verifier_policy)
        if self.verifier_policy.on_error == "min":
            mode = "train" if self.model.training else "eval"
            counts = faults_mod.error_counts(faults, len(self.reward_names))
            for name, count in zip(self.reward_names, counts):
                self._metrics[mode][f"verifier_errors/{name}"].append(float(count))
            self._metrics[mode]["verifier_error_rate"].append(len(faults) / (n_all * len(self.reward_names)))
            if faults and self.accelerator.is_main_process:
                logger.warning(
                    "%d failed verdict(s) scored as the reward's minimum (task.on_verifier_error=min); first: %s",
                    len(faults),
                    faults[0].line(),
                )
        if self._judge_columns:  # every process at every step: each judge's answer mass, over the whole batch
            parts = torch.tensor(
                model_reward_mod.answer_mass_parts(verifiers, self._judge_columns), device=device
            )
            parts = gather(parts[None]) if many else parts[None]  # [P, J, 3]: sum, count, min
            parts = torch.cat([parts[..., :2].sum(0), parts[..., 2].amin(0)[:, None]], 1).tolist()
            names = [self.reward_names[c] for c in self._judge_columns]
            mode = "train" if self.model.training else "eval"
            for key, value in model_reward_mod.answer_mass_metrics(parts, names).items():
                self._metrics[mode][key].append(value)
        raw = None
        if self.conditions:  # GDPO Eq. 8, before any advantage; the raw values stay for logging
            raw = gather(local.to(device))  # [N, K]
            local = self.task.condition(local)
        rewards = gather(local.to(device))  # [N, K]
        self._scored = _Scored(
            examples, texts, [list(map(int, c)) for c in completion_ids_list], rewards, verifiers, raw
        )
        return rewards

    # ------------------------------------------------------------------ capture of the rollout pass

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *a, **kw):
        # only the policy's own pass: not a separate reference model, nor TRL's reference pass of a PEFT
        # model (the same object with its adapter disabled)
        if self._captured is None or model is not self.model or _adapters_disabled(self._unwrapped()):
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, *a, **kw
            )
        t = logits_to_keep

        def hook(module, args, output):
            h = output.last_hidden_state
            # the precision the pass ran in: replay reuses it only when it runs in the same one
            self._captured.append((h[:, -t - 1 : -1].detach(), autocast_dtype(h.device)))

        handle = self._unwrapped().get_decoder().register_forward_hook(hook)
        try:
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, *a, **kw
            )
        finally:
            handle.remove()

    # ------------------------------------------------------------------ seam 2: advantages

    def _generate_and_score_completions(self, inputs):
        a = self.args
        mc = a.method
        scheme = mc.scheme
        kind = scheme.kind  # None: the scheme does not replay (no capture, no replay, no replay logging)
        self._captured = [] if kind is not None and kind.reuses_rollout and self._reuse_ok else None
        try:
            out = super()._generate_and_score_completions(inputs)
        finally:
            captured, self._captured = self._captured, None
        scored, self._scored = self._scored, None
        mode = "train" if self.model.training else "eval"
        g = self.num_generations if mode == "train" else self.num_generations_eval
        b = len(scored.examples)
        n = scored.rewards.shape[0]
        pi = self.accelerator.process_index
        rows = slice(pi * b, (pi + 1) * b)
        device = self.accelerator.device
        lengths_local = out["completion_mask"].sum(1).float()  # [B]
        mask = out["completion_mask"]
        if "tool_mask" in out:
            mask = mask * out["tool_mask"]
        mask = mask.bool()  # [B, T]
        bounds = self._bounds  # [K, 2]

        def distances(kind_name: str, adv_local: torch.Tensor) -> replay_mod.ReplayResult:  # DistanceFn
            return self._replay(out, scored, adv_local, captured, kind_name)

        # the one credit step of mrtpo.step: Â [N, K] of the gathered batch, replay, token advantages [B, T]
        res = credit_step(
            mc,  # validated once, by MRTPOConfig (loss='opsd' has credit='none')
            scored.rewards.cpu(),
            torch.arange(n) // g,
            mask,
            reward_min=bounds[:, 0],
            reward_max=bounds[:, 1],
            lengths=gather(lengths_local).cpu(),
            distances=distances,
            rows=rows,
            generator=torch.Generator(device=device).manual_seed(
                mc.seed * 1_000_003 + self.state.global_step * 1009 + pi
            )
            if kind is not None
            else None,
            step=self.state.global_step,
            reward_names=self.reward_names,
        )
        adv_all = res.advantages

        trl_adv_local = out["advantages"].detach()  # [B], TRL's own aggregation (kept for comparison)
        for _ in range(min(n, len(self._logs["advantages"]))):  # the completions table shows ours
            self._logs["advantages"].pop()
        self._logs["advantages"].extend(adv_all.sum(1).tolist())
        self._log_task_metrics(mode, scored)
        # the step's metrics and samples come from the core (mrtpo.step_log); the trainer reduces and writes
        responses = [
            StepResponse(ex, text, ids, vs, r)
            for ex, text, ids, vs, r in zip(
                scored.examples,
                scored.texts,
                scored.completion_ids,
                scored.verifiers,
                scored.rewards[rows].tolist(),
            )
        ]
        log = StepLog(res, mask, responses, self.processing_class, localization=a.log_localization)
        self._audit.log(self, mode, log.parts())
        if res.replayed is not None:
            self._warn_if_nothing_differs(res)

        token_adv = res.token_advantages if scheme.token_level and a.loss != "opsd" else None
        if a.loss == "opsd":
            out["advantages"] = torch.zeros(b, device=device)
            out["opsd_full_ids"] = [self._full_ids(ex) for ex in scored.examples]
        else:
            out["advantages"] = res.token_advantages if scheme.token_level else res.response_advantages

        self.last_batch = {
            "rewards": scored.rewards,
            "advantages": adv_all,
            "trl_advantages": trl_adv_local,
            "token_advantages": None if token_adv is None else token_adv.detach(),
            "distances": None if res.distances is None else res.distances.detach(),
            "replayed": res.replayed,
            "attributed": res.attributed,
            "completion_mask": mask,
            "process_rows": (rows.start, rows.stop),
            "examples": scored.examples,
            "texts": scored.texts,
            "completion_ids": scored.completion_ids,
            **vllm_mod.engine_sampling(out),  # vLLM's sampling log-probs and TRL's IS ratio (or None)
        }
        if mode == "train" and a.run_files and self.accelerator.is_main_process and a.log_samples:
            step = self.state.global_step + 1
            if step == 1 or step % max(1, int(self.args.logging_steps)) == 0:
                records = log.records(step, a.log_samples, method=mc.method)
                append_jsonl(f"{a.output_dir}/{SAMPLES_JSONL}", [r.to_json() for r in records])
        return out

    # ------------------------------------------------------------------ replay

    def _contexts(self, examples: list[Example]) -> list[replay_mod.Contexts]:
        """Replay contexts per example, from the run's :class:`mrtpo.replay.ContextCache` (one tokenization
        per distinct prompt)."""
        cache = self.__dict__.get("_context_cache")
        if cache is None:
            cache = self._context_cache = replay_mod.ContextCache(
                self.processing_class, self.reward_names, self.chat_template_kwargs
            )
        return cache([ex.segments for ex in examples])

    def _full_ids(self, ex: Example) -> list[int]:
        return replay_mod.tokenize_messages(
            self.processing_class, ex.messages(privileged=True), **(self.chat_template_kwargs or {})
        )

    def _replay(self, out, scored, adv_local, captured, kind: str) -> replay_mod.ReplayResult:
        """The replay kind ``kind`` of the local responses through :func:`mrtpo.replay.for_scheme`: its
        answer (distances ``[B, K', T]`` on the accelerator's device, T TRL's completion width; which rows
        ran; the stats). The rollout pass's hidden states (captured in
        :meth:`_get_per_token_logps_and_entropies`) are offered for reuse."""
        wrapped = getattr(self, "model_wrapped", None) or self.model
        rollout = None
        amp = {a for _, a in captured or []}  # the autocast dtype of each captured micro-batch
        if captured and self._reuse_ok and len(amp) == 1:
            pm = out["prompt_mask"].bool()
            rollout = replay_mod.RolloutPass(
                torch.cat([h for h, _ in captured], dim=0),  # [B, T, H]
                [out["prompt_ids"][j][pm[j]].tolist() for j in range(pm.shape[0])],
                amp.pop(),
            )
        # the forwards run in the policy's own precision (accelerate's autocast for TRL's bf16 / fp16, as
        # its own forwards); the projection and distances are float32 (mrtpo.replay)
        with (
            self.accelerator.autocast(),
            sharding_mod.replay_context(self._replay_sharding(), wrapped, self.accelerator) as sharding,
        ):
            res = replay_mod.for_scheme(
                self._unwrapped(),
                self._contexts(scored.examples),
                scored.completion_ids,
                adv_local.cpu(),
                kind,
                width=out["completion_ids"].shape[1],
                rollout=rollout,
                options=self.args.replay_options(sharding),
                temperature=self.temperature,
                pad_id=self._tokenizer.pad_token_id or 0,
                batch=replay_mod.ReplayBatch(
                    scored.examples,
                    scored.verifiers,
                    self.processing_class,
                    self.args.method_config.credit_options,
                ),
            )
        dev = self.accelerator.device
        attributed = None if res.attributed is None else res.attributed.to(dev)
        return replace(
            res, distances=res.distances.to(dev), replayed=res.replayed.to(dev), attributed=attributed
        )

    def _warn_if_nothing_differs(self, res) -> None:
        """Once: a warning when every context the replay kind compared was identical to ``C`` (RLSD
        without a privileged segment: teacher = student), so the token credit equals the response level."""
        st = res.replay_stats
        if self._warned_identical or st is None or st.pairs_run or not st.pairs_identical:
            return
        self._warned_identical = True
        logger.warning(
            "replay kind %r compared only contexts identical to the full context C in this batch (no "
            "privileged segment?): its token credit equals the response level",
            res.scheme.replay,
        )

    # ------------------------------------------------------------------ seam 3: OPSD loss

    def _compute_loss(self, model, inputs):
        if self.args.loss != "opsd":
            return super()._compute_loss(model, inputs)
        comp_ids, cmask = inputs["completion_ids"], inputs["completion_mask"]
        mask = cmask if "tool_mask" not in inputs else cmask * inputs["tool_mask"]
        t = comp_ids.shape[1]
        ids = torch.cat([inputs["prompt_ids"], comp_ids], dim=1)
        am = torch.cat([inputs["prompt_mask"], cmask], dim=1)
        # under parameter sharding (FSDP2, ZeRO-3) the student's logits come from the model's own forward, so
        # the engine's hooks gather the head and reduce its gradient (a head weight read outside its
        # module's forward has no correct gradient there: ZeRO-3 releases it, FSDP2 frees the unsharded
        # copy before the backward uses it); otherwise only the hidden states do, and the head is
        # projected a chunk of rows at a time (memory O(chunk * V) instead of O(B * T * V))
        module_head = sharding_mod.engine(getattr(self, "model_wrapped", None) or model) != "none"
        # student: through the (possibly DDP-wrapped) model so gradients synchronise
        student = model(
            input_ids=ids,
            attention_mask=am,
            output_hidden_states=not module_head,
            logits_to_keep=t + 1 if module_head else 1,
            use_cache=False,
        )
        unwrapped = self._unwrapped()
        was_training = unwrapped.training
        unwrapped.eval()  # the teacher is the deterministic policy (no dropout), stop-gradient
        try:
            with self.accelerator.autocast():  # the teacher computes in the student's precision
                h_t = response_hidden(
                    unwrapped.get_decoder(),
                    inputs["opsd_full_ids"],
                    comp_ids,
                    cmask,
                    pad_id=self._tokenizer.pad_token_id or 0,
                )  # [B, T, H], no grad
        finally:
            unwrapped.train(was_training)
        replay_mod.finish_body_calls(unwrapped)  # FSDP2: the teacher ran the body without the head
        head = head_of(unwrapped)  # the LM head with the model's logit transform (soft-capping, scaling)
        kw = dict(
            divergence=self.args.opsd_divergence,
            beta=self.args.opsd_beta,
            temperature=self.temperature,
            chunk_size=self.args.replay_chunk_size,
            scale=head.scale,
            softcap=head.softcap,
        )
        # the head as the forward applies it: gathered when sharded (then read for the teacher only, without
        # gradient), a LoRA adapter on the head merged in with autograd
        with head.full_parameters() as (weight, bias):
            if module_head:
                z_s = student.logits[:, -t - 1 : -1]  # [B, T, V]
                div = distill_divergence_from_logits(
                    z_s, h_t, weight.detach(), None if bias is None else bias.detach(), mask.bool(), **kw
                )  # [B, T]
            else:
                h_s = student.hidden_states[-1][:, -t - 1 : -1]  # [B, T, H]
                div = distill_divergence_from_hidden(h_s, h_t, weight, bias, mask.bool(), **kw)  # [B, T]
        self.last_loss_terms = {"opsd_divergence": div.detach()}  # [B, T]: the check of the matrix
        loss = masked_token_mean(vllm_mod.weight_tokens(div, inputs), mask)  # vLLM: TRL's IS ratio
        mode = "train" if self.model.training else "eval"
        totals = self.accelerator.reduce(
            torch.stack([(div.detach() * mask).sum(), mask.sum().float()]), "sum"
        )
        self._metrics[mode]["opsd/divergence"].append((totals[0] / totals[1].clamp(min=1)).item())
        if mode == "train":
            loss = loss / self.current_gradient_accumulation_steps
        return loss

    # ------------------------------------------------------------------ logging

    def _log_task_metrics(self, mode, scored):
        """The task's metrics of the local responses (``task/<key>``) and, for conditioned rewards,
        ``conditions/<reward>/*``, reduced over processes."""
        m = self._metrics[mode]
        b = len(scored.examples)
        pi = self.accelerator.process_index
        raw = scored.raw if scored.raw is not None else scored.rewards  # task metrics: the raw rewards
        local_rewards = raw[pi * b : (pi + 1) * b].cpu()
        if self.conditions:  # gathered [N, K]: the same on every process
            for key, value in condition_metrics(raw.cpu(), scored.rewards.cpu(), self.conditions).items():
                m[key].append(value)
        task_metrics = self.task.metrics(scored.examples, scored.texts, local_rewards) or {}
        # the keys depend on each process's examples (e.g. the constraint types its prompts list): one
        # object gather, on every process at every step, then each key's mean over the processes that
        # report it, weighted by their responses
        parts = [(b, {str(k): float(v) for k, v in task_metrics.items()})]
        if self.accelerator.num_processes > 1:
            parts = gather_object(parts)
        for key in sorted({k for _, d in parts for k in d}):
            num = sum(n * d[key] for n, d in parts if key in d)
            den = sum(n for n, d in parts if key in d)
            m[f"task/{key}"].append(num / den if den else 0.0)
