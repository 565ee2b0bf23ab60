"""Training from a config: build the task, data, model and :class:`MRTPOTrainer`, run it, resume it.

The config's sections, reading and validation are :mod:`mrtpo.integrations.trl.schema` (light: no torch,
transformers or TRL); this module is what runs it. Its names are importable from here too
(``load_config``, ``RunConfig``, ``parse_overrides``, ``apply_overrides``).

``model.tiny`` builds a random tiny Qwen2 model (``mrtpo.models.tiny``) on a word-level tokenizer of
every word in the loaded examples (plus ``model.tiny.words``): a CPU smoke run, no download;
``model.dtype`` applies to it too (``auto``: float32).

``peft`` (optional) trains a PEFT LoRA adapter instead of the full model: its keys are
``peft.LoraConfig`` fields (``r``, ``lora_alpha``, ``lora_dropout``, ``target_modules``,
``modules_to_save``, ...), passed to TRL as ``peft_config``. TRL's reference model (``trl.beta > 0``)
is then the model with the adapter disabled.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mrtpo.integrations.trl import run_folder, run_lock
from mrtpo.integrations.trl.checks import load_task_spec
from mrtpo.integrations.trl.run_folder import RUN_FILES  # noqa: F401  (recipe.RUN_FILES)
from mrtpo.integrations.trl.schema import (
    TRAINER_DEFAULTS,
    RunConfig,
    apply_overrides,
    import_config_plugins,
    load_config,
    parse_overrides,
)

__all__ = [
    "TRAINER_DEFAULTS",
    "RunConfig",
    "RunFolderNotEmpty",
    "TrainingInterrupted",
    "apply_overrides",
    "build_trainer",
    "import_config_plugins",
    "load_config",
    "load_task_spec",
    "parse_overrides",
    "train",
]

TINY_KEYS = (
    "hidden_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "intermediate_size",
    "tie_embeddings",
    "seed",
)
"""``model.tiny`` keys that go to :func:`mrtpo.models.tiny.build_model` (``words`` goes to the tokenizer)."""


def _tiny_model_and_tokenizer(spec: dict[str, Any], examples, dtype: str = "auto") -> tuple[Any, Any]:
    import torch

    from mrtpo.models.tiny import build_model, build_tokenizer

    words: list[str] = []
    seen: set[str] = set()
    for ex in examples:
        for seg in ex.segments:
            for w in seg.text.split():
                if w not in seen:
                    seen.add(w)
                    words.append(w)
    for w in spec.get("words") or []:
        if str(w) not in seen:
            seen.add(str(w))
            words.append(str(w))
    tok = build_tokenizer(words)
    kw = {k: spec[k] for k in TINY_KEYS if spec.get(k) is not None}  # words: the tokenizer's, above
    model = build_model(len(tok), dtype=getattr(torch, "float32" if dtype == "auto" else dtype), **kw)
    return model, tok


def _hf_model_and_tokenizer(path: str, dtype: str):
    from mrtpo.models.loading import load_model_and_tokenizer

    try:
        return load_model_and_tokenizer(path, dtype=dtype, device=None, eval_mode=False)
    except OSError as e:  # not a local folder, and not reachable or unknown on the hub
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise FileNotFoundError(f"field 'model.path': cannot load {path!r}: {first}") from None


def build_trainer(
    config: RunConfig,
    *,
    model=None,
    tokenizer=None,
    task=None,
    train_examples=None,
    eval_examples=None,
    callbacks=None,
):
    """Load the task, data, model and tokenizer of ``config`` and build the :class:`MRTPOTrainer`.

    Any of ``model``/``tokenizer``/``task``/``train_examples`` given here replaces what the config
    would load (programmatic use: the demo passes its own warm-started model).
    """
    from mrtpo.integrations.deepspeed_cpu import use_gloo_allreduce_on_cpu
    from mrtpo.integrations.trl.trainer import MRTPOTrainer

    use_gloo_allreduce_on_cpu()  # DS_ACCELERATOR=cpu: no 200 s compile of a kernel, no lock left behind
    args = config.trainer_config()
    config.check_environment()
    if task is None:
        task = load_task_spec(config.task["name"], config.task["options"], config.origins.note)
    d = config.data
    if train_examples is None:
        train_examples = task.load(d["source"], split=d["split"], limit=d["limit"])
    if eval_examples is None and d["eval_split"]:
        eval_examples = task.load(d["source"], split=d["eval_split"], limit=d["eval_limit"])
    if not train_examples:
        raise ValueError(f"task {config.task['name']!r} loaded no training examples from {d['source']!r}")
    if model is None or tokenizer is None:
        if config.model.get("tiny") is not None:
            m, t = _tiny_model_and_tokenizer(
                config.model["tiny"], list(train_examples) + list(eval_examples or []), config.model["dtype"]
            )
        else:
            m, t = _hf_model_and_tokenizer(config.model["path"], config.model["dtype"])
        model, tokenizer = model or m, tokenizer or t
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    run_info = {"model": config.model.get("path") or "tiny", "config": config.raw, "peft": config.peft}
    if config.peft is not None or args.use_vllm:  # the adapter's base, vLLM's model folder: a path that loads
        _record_peft_base(model, tokenizer, Path(args.output_dir))
    trainer = MRTPOTrainer(
        model,
        args=args,
        task=task,
        train_dataset=list(train_examples),
        eval_dataset=list(eval_examples) if eval_examples else None,
        processing_class=tokenizer,
        run_info=run_info,
        callbacks=callbacks,
        peft_config=config.peft_config(),
        verifier_policy=verifier_policy(config),
    )
    from mrtpo.integrations.trl.run_logging import use_compact_progress

    use_compact_progress(trainer)  # one short line per logged step; the whole dict is in metrics.jsonl
    return trainer


def verifier_policy(config: RunConfig):
    """The :class:`mrtpo.tasks.faults.VerifierPolicy` of ``task.on_verifier_error`` and
    ``task.max_verifier_error_rate``."""
    from mrtpo.tasks.faults import VerifierPolicy

    return VerifierPolicy.from_fields(
        config.task.get("on_verifier_error"), config.task.get("max_verifier_error_rate")
    )


def _record_peft_base(model, tokenizer, out: Path) -> None:
    """Make the model's ``name_or_path`` a base that loads anywhere: what the adapter a LoRA run saves names
    (``base_model_name_or_path`` in adapter_config.json) and the folder TRL's vLLM engine loads
    (``vllm.LLM(model=model.name_or_path)``). A hub id stays as it is, a local folder becomes its absolute
    path, and a model with neither (the tiny model built from the config) is saved with its tokenizer into
    ``RUN/base/`` (by the first process) and named by that folder's absolute path."""
    from mrtpo.models.loading import looks_like_path

    name = str(getattr(model, "name_or_path", "") or "")
    if name and Path(name).expanduser().is_dir():
        name = str(Path(name).expanduser().resolve())
    elif not name or looks_like_path(name):  # built in memory, or a folder that is gone
        base = (out / "base").resolve()
        if int(os.environ.get("RANK", "0")) == 0:
            model.save_pretrained(base)
            tokenizer.save_pretrained(base)
        name = str(base)
    model.name_or_path = name
    model.config._name_or_path = name


def save_merged_model(trainer, out: Path) -> Path:
    """``peft.save_merged``: move the adapter ``trainer.save_model()`` wrote into ``RUN/adapter/`` and
    write the merged model (base weights plus the LoRA update) and the tokenizer into ``RUN``, so that
    ``from_pretrained(RUN)`` loads it without peft. Returns the adapter folder."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    adapter = out / "adapter"
    if trainer.accelerator.is_main_process:
        adapter.mkdir(exist_ok=True)
        for p in [*out.glob("adapter_*"), out / "README.md"]:
            if p.is_file():
                p.replace(adapter / p.name)
        base_path = json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
        base = AutoModelForCausalLM.from_pretrained(base_path, dtype="auto")
        merged = PeftModel.from_pretrained(base, adapter).merge_and_unload()
        merged.save_pretrained(out)
        trainer.processing_class.save_pretrained(out)
    trainer.accelerator.wait_for_everyone()
    return adapter


class RunFolderNotEmpty(ValueError):
    """``trl.output_dir`` holds an earlier run and neither resume nor overwrite was asked for."""


class TrainingInterrupted(Exception):
    """Training stopped on Ctrl-C (SIGINT) after saving a checkpoint.

    Attributes: ``step`` (the last optimizer step), ``checkpoint`` (its folder), ``trainer``.
    """

    def __init__(self, step: int, checkpoint: Path | None, trainer) -> None:
        super().__init__(f"interrupted at step {step}")
        self.step, self.checkpoint, self.trainer = step, checkpoint, trainer


def _prepare_run_folder(out: Path, overwrite: bool, log) -> None:
    entries = [p for p in out.iterdir() if p.name != run_lock.LOCK_NAME] if out.is_dir() else []
    if not entries:
        return
    if not overwrite and run_folder.untrained(out):  # a run that failed before its first step
        if int(os.environ.get("RANK", "0")) == 0:
            log(f"{out} holds a run that stopped before its first step: starting it again")
            run_folder.clear(out)
        return
    if not overwrite:
        first = ("run.json", "metrics.jsonl", "samples.jsonl", "model.safetensors")
        held = sorted((p.name for p in entries), key=lambda n: (n not in first, n))
        n_ckpt = sum(1 for h in held if h.startswith("checkpoint-"))
        shown = [h for h in held if not h.startswith("checkpoint-")][:4]
        if n_ckpt:
            shown.append(f"{n_ckpt} checkpoint(s)")
        raise RunFolderNotEmpty(
            f"run folder {str(out)!r} is not empty ({', '.join(shown)}): add --resume to continue that run, "
            "--overwrite to delete its run files and checkpoints and start again, or choose another "
            "--trl.output_dir"
        )
    if int(os.environ.get("RANK", "0")) == 0:  # several processes (accelerate launch): the first deletes
        run_folder.clear(out)


def _resume_target(out: Path, resume: str | bool, log) -> str:
    from mrtpo.integrations.trl.checkpoints import checkpoint_problems, pick_checkpoint

    if isinstance(resume, str):
        if not Path(resume).is_dir():
            raise FileNotFoundError(f"checkpoint folder {resume!r} does not exist")
        problems = checkpoint_problems(resume)
        if problems:
            raise ValueError(
                f"checkpoint {resume!r} cannot be resumed exactly: {', '.join(problems)}; "
                "give a complete checkpoint-N folder (or --resume alone: the newest complete one)"
            )
        return resume
    folder, skipped = pick_checkpoint(out)
    if folder is None:
        if not skipped:
            raise FileNotFoundError(f"--resume: no checkpoint-* folder in {str(out)!r}")
        raise ValueError(
            f"--resume: no complete checkpoint in {str(out)!r} ("
            + "; ".join(f"{p.name}: {', '.join(pr)}" for p, pr in skipped)
            + ")"
        )
    for p, problems in skipped:
        log(f"{p.name} is incomplete ({', '.join(problems)}): resuming from {folder.name} instead")
    return str(folder)


def _interrupt_callback():
    from transformers import TrainerCallback

    class StopOnInterrupt(TrainerCallback):
        """After the first SIGINT: finish the current optimizer step, save a checkpoint, stop."""

        requested = False

        def on_step_end(self, args, state, control, **kwargs):
            if self.requested:
                control.should_save = True
                control.should_training_stop = True

    return StopOnInterrupt()


def _save_after_failure(trainer, out: Path, log) -> str | None:
    """A checkpoint of the last completed optimizer step after a failure inside a step (the weights have
    not changed since that step; the RNG states are those of the moment of failure), unless a complete
    one of that step exists; its folder, or None when no step completed or it could not be written."""
    from mrtpo.integrations.trl.checkpoints import checkpoint_problems

    if trainer.state.global_step == 0:  # no step completed: nothing to keep
        return None
    folder = out / f"checkpoint-{trainer.state.global_step}"
    if folder.is_dir() and not checkpoint_problems(folder):
        return str(folder)
    try:
        trainer._save_checkpoint(trainer.model, trial=None)
        trainer.control = trainer.callback_handler.on_save(trainer.args, trainer.state, trainer.control)
    except Exception as e:  # the failure is what the user must see; the save's own error is logged
        log(f"could not save {folder.name} after the failure: {type(e).__name__}: {e}")
        return None
    return str(folder) if folder.is_dir() else None


def train(
    config: RunConfig | dict | str | Path,
    overrides: Sequence[tuple[str, Any]] = (),
    *,
    resume: str | bool | None = None,
    overwrite: bool = False,
    break_lock: bool = False,
    save_final: bool = True,
    log=None,
    **build_kwargs,
):
    """Train from a config (a :class:`RunConfig`, a raw dict or a YAML path); returns the trainer.

    The run folder (``trl.output_dir``) must be empty or absent, unless ``resume`` (continue it) or
    ``overwrite`` (delete its run files, checkpoints, logs and model first). At the end the model and
    tokenizer are saved into it (``trainer.save_model()``; loadable with ``from_pretrained``). The run
    folder's lock (``RUN/run.lock``) is held from before anything is written until the end (a second
    process is refused: :class:`mrtpo.integrations.trl.run_lock.RunFolderLocked`). ``resume`` of a run
    that already reached its last step trains nothing, changes no file and returns None.

    Ctrl-C (SIGINT, in the main thread) stops after the current optimizer step, saves a checkpoint and
    raises :class:`TrainingInterrupted`; a second Ctrl-C stops at once (KeyboardInterrupt). A failed
    verdict that the task's policy does not absorb (``task.on_verifier_error``) saves a checkpoint of the
    last completed step and raises :class:`mrtpo.tasks.faults.VerifierError` (``step``, ``checkpoint``).

    Args:
        overrides: dotted ``(key, value)`` pairs applied on top of the config.
        resume: True for the newest complete checkpoint in ``trl.output_dir`` (incomplete newer ones are
            skipped and named through ``log``), a checkpoint folder (refused when incomplete), or None.
        overwrite: start again in a non-empty run folder.
        break_lock: take the run folder's lock even when another process holds it
            (:mod:`mrtpo.integrations.trl.run_lock`; a lock left behind on another host).
        save_final: save the final model and tokenizer into ``trl.output_dir``.
        log: a ``str -> None`` for notices (default: print to stderr).
        build_kwargs: see :func:`build_trainer` (model, tokenizer, task, train_examples, ...).
    """
    log = log or (lambda msg: print(f"mrtpo train: {msg}", file=sys.stderr, flush=True))
    if isinstance(config, RunConfig):
        cfg = config if not overrides else load_config(raw=config.raw, overrides=overrides)
    elif isinstance(config, dict):
        cfg = load_config(raw=config, overrides=overrides)
    else:
        cfg = load_config(config, overrides)
    out = Path(cfg.trainer["output_dir"])
    cfg.check()  # a bad field fails before anything is deleted or loaded
    args = cfg.trainer_config()
    if resume:
        done = run_folder.completed_step(out, resume, args)
        if done is not None:  # a finished run: nothing is trained, no file is touched (no lock taken)
            if not break_lock:  # but a live holder may be writing it still (its final model): refused
                run_lock.check_launch(out)
            if int(os.environ.get("RANK", "0")) == 0:
                log(done[1])
            return None
        if isinstance(resume, str):  # read only: a bad checkpoint named is refused before the lock
            resume = _resume_target(out, resume, log)
        elif not out.is_dir():  # before the lock creates it
            raise FileNotFoundError(
                f"--resume: the run folder {str(out)!r} (trl.output_dir) does not exist: check the path, or "
                "start the run without --resume"
            )
    with run_folder.output_dir_errors(out):  # below a file, read-only, full: one line
        lock = run_lock.take(out, break_lock=break_lock, log=log)  # before anything is written
    try:
        with run_folder.output_dir_errors(out):
            return _train_locked(cfg, out, resume, overwrite, save_final, log, lock, build_kwargs)
    finally:
        if lock is not None:
            lock.release()


def _train_locked(cfg, out: Path, resume, overwrite: bool, save_final: bool, log, lock, build_kwargs):
    """:func:`train` once the run folder's lock is held (``lock``: None on the other processes)."""
    import signal
    import threading

    from mrtpo.tasks.faults import VerifierError

    first = int(os.environ.get("RANK", "0")) == 0  # the others may find it emptied by the first already
    if resume is True and run_folder.untrained(out, empty=not first):  # stopped before its first step
        if first:
            log(f"{out} holds no trained step (the run stopped before its first): starting it again")
        resume = None
    elif resume is True:
        resume = _resume_target(out, resume, log)
    if resume:
        if int(os.environ.get("RANK", "0")) == 0:
            step = _checkpoint_step(resume)
            log(f"resuming from {Path(resume).resolve()} (step {step})")
    else:
        _prepare_run_folder(out, overwrite, log)
    trainer = build_trainer(cfg, **build_kwargs)
    trainer.add_callback(run_lock.guard_callback(out, lock))
    if trainer.accelerator.is_main_process:
        from mrtpo.integrations.trl.run_logging import estimate_run_bytes

        forecast = estimate_run_bytes(trainer)
        log(forecast["text"])
        run_folder.check_free_space(out, forecast, log)  # the first checkpoint must fit
    stopper = _interrupt_callback()
    trainer.add_callback(stopper)

    def on_sigint(signum, frame):
        if stopper.requested:
            raise KeyboardInterrupt
        stopper.requested = True
        log("Ctrl-C: stopping after this step and saving a checkpoint (Ctrl-C again to stop at once)")

    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, on_sigint) if main_thread else None
    try:
        trainer.train(resume_from_checkpoint=resume or None)
    except VerifierError as e:  # a failed verdict stopped the run: keep what was trained
        e.step = trainer.state.global_step
        e.checkpoint = _save_after_failure(trainer, out, log)
        raise
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, previous)
    if stopper.requested:
        step = trainer.state.global_step
        folder = out / f"checkpoint-{step}"
        raise TrainingInterrupted(step, folder if folder.is_dir() else None, trainer)
    if save_final:
        trainer.save_model()
        if cfg.peft_save_merged:
            save_merged_model(trainer, out)
    return trainer


def _checkpoint_step(folder: str | Path) -> str:
    """The optimizer step a checkpoint folder holds (its trainer_state.json; else its name's number)."""
    state = Path(folder) / "trainer_state.json"
    try:
        return str(int(json.loads(state.read_text())["global_step"]))
    except (OSError, ValueError, KeyError, TypeError):
        tail = Path(folder).name.rpartition("-")[2]
        return tail if tail.isdigit() else "unknown"
