"""The RL runs of the demo (GRPO, GDPO, MRTPO and its controls) through
:class:`mrtpo.integrations.trl.MRTPOTrainer`.

Every run starts from the same warm-start folder, trains on the same built-in toy prompts with the
same optimiser settings (:class:`RLConfig`, chosen once for all methods), and differs only in the
method; runs of one seed share TRL's seed (data order and sampling). Each run is built by :func:`mrtpo.integrations.trl.recipe.build_trainer` from a config dict
(the sections of ``recipes/*.yaml``) and writes a run folder in the docs/run-format.md format.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

METHODS: dict[str, dict[str, Any]] = {
    "grpo": {"advantage_method": "grpo", "credit": "none"},
    "gdpo": {"advantage_method": "gdpo", "credit": "none"},
    "mrtpo": {"advantage_method": "gdpo", "credit": "reward"},
    "shuffled": {"advantage_method": "gdpo", "credit": "shuffled"},
    "joint": {"advantage_method": "gdpo", "credit": "joint"},
    "mrtpo-beta0": {"advantage_method": "gdpo", "credit": "reward", "credit_beta": 0.0},
    "mrtpo-beta0.25": {"advantage_method": "gdpo", "credit": "reward", "credit_beta": 0.25},
    "mrtpo-beta1": {"advantage_method": "gdpo", "credit": "reward", "credit_beta": 1.0},
    "mrtpo-scaled": {"advantage_method": "gdpo", "credit": "scaled"},
    "scaled-shuffled": {"advantage_method": "gdpo", "credit": "scaled_shuffled"},
    "rdpo": {"advantage_method": "rdpo", "credit": "none"},
    "rdpo-mrtpo": {"advantage_method": "rdpo", "credit": "reward"},
    "rlsd": {"advantage_method": "gdpo", "credit": "rlsd"},
    "mrtpo-capped": {"advantage_method": "gdpo", "credit": "capped"},
}
"""Method sections of the demo's runs. GRPO and GDPO give every token the response advantage
(``credit="none"``); MRTPO is GDPO's per-reward advantages spread by per-reward replay distances
(β = :attr:`RLConfig.credit_beta`, 0.5). Controls (the paper's Tables 5–7): ``shuffled`` permutes
MRTPO's token weights within each response (same credit, wrong tokens), ``joint`` uses one replay
distance without every reward's information for all rewards, and ``mrtpo-beta*`` set the allocation
strength β (β = 0 gives every token GDPO's response advantage, with replay still run). ``mrtpo-scaled``
shrinks each (response, reward) row's weights towards 1 by the row's largest distance
(:func:`mrtpo.credit.scaled_weights`: a reward whose information hardly moves the policy, such as the
non-local length constraint, keeps close to GDPO's credit); ``scaled-shuffled`` is its shuffled control.
Other methods: ``rdpo`` (RDPO's advantages, response level), ``rdpo-mrtpo`` (RDPO's per-reward advantages
with MRTPO's credit) and ``rlsd`` (RLSD on GDPO's response advantage, λ = β; on the toy task, whose
prompts have no privileged segment, its teacher is the student, so it gives GDPO's advantages).
``mrtpo-capped`` shrinks each row's weights towards 1 just enough that no token's weight exceeds 2
(:func:`mrtpo.demo.schemes.capped_weights`). ``--methods`` picks them; the default is
:data:`DEFAULT_METHODS`."""

LABELS: dict[str, str] = {"mrtpo-capped": "MRTPO (capped)"}
"""Display names of the demo's methods whose credit scheme the run labels do not know."""

DEFAULT_METHODS: tuple[str, ...] = ("grpo", "gdpo", "mrtpo", "shuffled", "joint")
"""What ``mrtpo demo`` trains by default."""

SCALED: tuple[str, ...] = ("gdpo", "mrtpo-scaled", "scaled-shuffled")
"""The scaled allocation with GDPO and its own shuffled control (``mrtpo demo --scaled`` adds them)."""

BETA_SWEEP: tuple[str, ...] = ("mrtpo-beta0", "mrtpo-beta0.25", "mrtpo", "mrtpo-beta1")
"""MRTPO at β = 0, 0.25, 0.5, 1 (``mrtpo demo --beta-sweep`` adds them)."""


@dataclass
class RLConfig:
    """Settings shared by every RL run of the demo (the same for all methods, chosen once).

    How they were chosen (docs/demo.md): a probe of GDPO and MRTPO on two seeds at the earlier
    setting (learning rate 1e-3, one optimizer step per sampled batch, so the PPO ratio is always 1
    and the clip never acts) showed gradient norms before clipping up to 25 (GDPO) and 78 (MRTPO); at
    learning rate 5e-4 with two optimizer steps per batch (``num_iterations=2``: the second step sees
    a ratio other than 1, so the clip acts) they stayed at 5–12 for both. GDPO then did not reach a
    training satisfaction of 0.9 within 120 steps, so the runs have 240 (120 sampled batches). The
    choice looked at stability only, before the five-seed comparison, and applies to every method.
    """

    steps: int = field(default=240, metadata={"help": "optimizer steps per run"})
    prompts_per_step: int = field(default=8, metadata={"help": "prompts P per step"})
    num_generations: int = field(default=8, metadata={"help": "responses G per prompt"})
    learning_rate: float = field(default=5e-4, metadata={"help": "AdamW learning rate (all methods)"})
    num_iterations: int = field(
        default=2,
        metadata={"help": "optimizer steps per sampled batch (TRL's num_iterations; > 1 lets the clip act)"},
    )
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient-norm clip (all methods)"})
    epsilon: float = field(default=0.2, metadata={"help": "PPO ratio clip range (TRL's epsilon)"})
    credit_beta: float = field(default=0.5, metadata={"help": "MRTPO allocation strength beta"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature"})
    max_completion_length: int = field(
        default=12, metadata={"help": "response token limit (9 words + eos fit)"}
    )
    log_samples: int = field(default=4, metadata={"help": "responses saved to samples.jsonl per step"})
    task_size: int = field(default=4096, metadata={"help": "built-in training prompts (3–5 constraints)"})
    curve_every: int = field(
        default=20,
        metadata={
            "help": "optimizer steps between the points of the held-out curves (mrtpo.demo.dynamics); 0: none"
        },
    )
    curve_examples: int = field(default=128, metadata={"help": "held-out prompts of each curve point"})

    def __post_init__(self) -> None:
        for name in ("steps", "prompts_per_step", "num_generations", "max_completion_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_generations < 2:
            raise ValueError(
                f"num_generations must be >= 2 (a group needs two responses), got {self.num_generations}"
            )
        if self.num_iterations < 1:
            raise ValueError(f"num_iterations must be >= 1, got {self.num_iterations}")
        if self.steps % self.num_iterations:
            raise ValueError(
                f"steps ({self.steps}) must be a multiple of num_iterations ({self.num_iterations})"
            )
        if self.curve_every < 0 or self.curve_examples < 1:
            raise ValueError(
                f"curve_every must be >= 0 and curve_examples >= 1, got {self.curve_every}, {self.curve_examples}"
            )
        if not 0.0 <= self.credit_beta <= 1.0:
            raise ValueError(f"credit_beta must be in [0, 1], got {self.credit_beta}")


def run_config(
    method: str, seed: int, rl: RLConfig, warm_start_dir: str | Path, output_dir: str | Path
) -> dict:
    """The config dict (sections model/task/data/method/trl) of one demo run."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {sorted(METHODS)}, got {method!r}")
    m = dict(METHODS[method])
    m = {"method": m.pop("advantage_method"), **m}  # the method block (mrtpo.method.MethodConfig's keys)
    m.setdefault("credit_beta", rl.credit_beta)
    return {
        "model": {"path": str(warm_start_dir), "dtype": "float32"},
        "task": {"name": "toy", "options": {"seed": 0, "size": rl.task_size}},
        "data": {"split": "train"},
        "method": m,
        "log": {"samples": rl.log_samples},
        "trl": {
            "output_dir": str(output_dir),
            "max_steps": rl.steps,
            "per_device_train_batch_size": rl.prompts_per_step * rl.num_generations,
            "num_generations": rl.num_generations,
            "max_completion_length": rl.max_completion_length,
            "learning_rate": rl.learning_rate,
            "num_iterations": rl.num_iterations,
            "max_grad_norm": rl.max_grad_norm,
            "epsilon": rl.epsilon,
            "lr_scheduler_type": "constant",
            "warmup_steps": 0,
            "temperature": rl.temperature,
            "beta": 0.0,
            "logging_steps": 1,
            "save_strategy": "no",
            "report_to": [],
            "use_cpu": True,
            "bf16": False,
            "seed": seed,
            "data_seed": seed,
        },
    }


def run_one(
    method: str,
    seed: int,
    rl: RLConfig,
    warm_start_dir: str | Path,
    output_dir: str | Path,
    *,
    progress: bool = True,
) -> dict:
    """Train one method from the warm start (run folder in ``output_dir``).

    With ``rl.curve_every`` > 0 the run records the curves of :mod:`mrtpo.demo.dynamics` (held-out
    satisfaction, KL to the warm start, entropy, credit concentration) into its metrics.jsonl.

    Returns:
        ``{"method", "seed", "run_dir", "seconds", "curve_seconds", "trainer"}``; ``trainer.model`` is
        the trained policy; ``curve_seconds``: the part of ``seconds`` spent recording the curves.
    """
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from mrtpo.demo import schemes  # noqa: F401  (registers the demo's credit schemes)
    from mrtpo.integrations.trl.recipe import build_trainer, load_config

    t0 = time.perf_counter()
    cfg = run_config(method, seed, rl, warm_start_dir, output_dir)
    cfg["trl"]["disable_tqdm"] = not progress
    trainer = build_trainer(load_config(raw=cfg))
    # a named step bar instead of the per-step printout of every metric (they are in metrics.jsonl)
    trainer.pop_callback(ProgressCallback)
    trainer.pop_callback(PrinterCallback)
    if progress:
        trainer.add_callback(quiet_progress(f"{method} seed {seed}"))
    recorder = None
    if rl.curve_every > 0:
        from mrtpo.demo.dynamics import dynamics_callback
        from mrtpo.demo.pipeline import heldout_examples

        recorder = dynamics_callback(
            trainer,
            warm_start_dir,
            heldout_examples(rl.curve_examples),
            every=rl.curve_every,
            seed=seed,
            scheme=cfg["method"]["credit"],
        )
        trainer.add_callback(recorder)
    trainer.train()
    return {
        "method": method,
        "seed": seed,
        "run_dir": str(output_dir),
        "seconds": time.perf_counter() - t0,
        "curve_seconds": recorder.seconds if recorder is not None else 0.0,
        "trainer": trainer,
    }


def _quiet_progress_class():
    from transformers.trainer_callback import ProgressCallback

    class QuietProgress(ProgressCallback):
        """TRL's training bar, named after the run, without the printed log dicts."""

        def __init__(self, desc: str) -> None:
            super().__init__()
            self.desc = desc

        def on_train_begin(self, args, state, control, **kwargs):
            super().on_train_begin(args, state, control, **kwargs)
            if self.training_bar is not None:
                self.training_bar.set_description(self.desc)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if self.training_bar is not None and logs and "task/satisfaction" in logs:
                self.training_bar.set_postfix(satisfaction=f"{logs['task/satisfaction']:.2f}")

    return QuietProgress


def quiet_progress(desc: str):
    """A :class:`~transformers.ProgressCallback` that shows a named bar and the satisfaction, and does
    not print the log dicts (the class is built on first use so transformers loads lazily)."""
    return _quiet_progress_class()(desc)
