"""``mrtpo train CONFIG.yaml [--plugin MODULE ...] [--section.key VALUE ...] [--resume [CHECKPOINT]] [--overwrite]``.

Trains with :class:`mrtpo.MRTPOTrainer` from a YAML config (see ``recipes/``, docs/config.md and
:mod:`mrtpo.integrations.trl.schema`; a bad field fails before torch is imported). Writes the run folder (``trl.output_dir``): run.json, metrics.jsonl,
samples.jsonl, TRL checkpoints and, at the end, the final model and tokenizer. A non-empty run folder
is refused unless ``--resume`` (continue from its newest complete checkpoint, or the one named, with its
optimizer state, scheduler, RNG and data order) or ``--overwrite`` (start again) is given. Ctrl-C saves
a checkpoint after the current step and prints the command that resumes; so does a failed verdict that
the task's policy does not absorb (``task.on_verifier_error``, :mod:`mrtpo.tasks.faults`), in one line
naming the verifier, the example and the cause (exit code 1). The run folder is locked while a process
trains it (``RUN/run.lock``, :mod:`mrtpo.integrations.trl.run_lock`): a second ``mrtpo train`` into it
(``--resume`` too) is refused in one line naming the holder; ``--break-lock`` takes a lock left behind
on another host. ``--plugin MODULE`` (repeatable,
before or after the config) imports a module of the user's own before the config is validated, as the
config's ``plugins:`` list does (:mod:`mrtpo.plugins`).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import textwrap


def fields_help() -> str:
    """The config fields one may set, by section, and the names the registries know (advantage methods,
    credit schemes, tasks: plug-ins' included), generated from the config's schema and the registries."""
    from mrtpo import advantages, credit
    from mrtpo.integrations.trl import schema, trl_fields
    from mrtpo.integrations.trl.checks import import_builtin_tasks
    from mrtpo.tasks import TASKS

    import_builtin_tasks()
    described = trl_fields.load()["fields"]
    groups = [
        ("model", ["path", "dtype", *(f"tiny.{k}" for k in schema.TinySection.model_fields)]),
        ("task", list(schema.TaskSection.model_fields)),
        ("data", list(schema.DataSection.model_fields)),
        (
            "method (the method block, mrtpo.method.MethodConfig; verl: algorithm.mrtpo)",
            list(schema.METHOD_FIELDS),
        ),
        *((name, list(cls.model_fields)) for name, cls in schema.OPTION_SECTIONS.items()),
        ("trl: TRL's GRPOConfig", sorted(n for n, d in described.items() if d["group"] == "grpo")),
        (
            "trl: transformers' TrainingArguments",
            sorted(n for n, d in described.items() if d["group"] != "grpo"),
        ),
        ("peft", ["peft.LoraConfig fields (r, lora_alpha, target_modules, ...)", "save_merged"]),
    ]
    lines = ["config fields (--section.key VALUE; defaults: --print-config):"]
    for title, names in groups:
        lines.append(f"  {title}:")
        lines.extend(
            textwrap.wrap(", ".join(names), width=100, initial_indent="    ", subsequent_indent="    ")
        )
    lines.append("registered names (plug-ins add theirs: --plugin MODULE):")
    for title, names in (
        ("method.method (advantage methods)", advantages.available()),
        ("method.credit (credit schemes)", credit.CREDIT_SCHEMES.names()),
        ("task.name (tasks; or module:Class of your own)", TASKS.names()),
    ):
        lines.append(f"  {title}:")
        lines.extend(
            textwrap.wrap(", ".join(names), width=100, initial_indent="    ", subsequent_indent="    ")
        )
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "config", help="YAML config (sections model, task, data, method, loss, replay, log, trl, peft)"
    )
    from mrtpo.plugins import add_plugin_argument

    add_plugin_argument(parser)
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved config (overrides applied, every default filled in) and exit",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: torch's; 1 is faster when other work loads the cores)",
    )
    parser.add_argument(
        "--break-lock",
        action="store_true",
        help="take the run folder's lock (RUN/run.lock) even when it names a process that may be running: "
        "for a lock left behind on another host (on the same host a lock whose process is gone is taken "
        "over without it)",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="print third-party warnings (transformers, TRL, DeepSpeed, torch) as they come; by default "
        "they are counted and summarized in one line at the end",
    )
    parser.add_argument(
        "overrides",
        nargs=argparse.REMAINDER,
        metavar="--section.key VALUE",
        help="overrides, e.g. --method.credit_beta 0.3 --trl.max_steps=10; --resume [CHECKPOINT] continues "
        "the run folder; --overwrite starts it again",
    )
    error = parser.error

    def named_error(message: str):  # no recipe: say what is missing, not that overrides are required
        if message.startswith("the following arguments are required: config"):
            message = (
                "a recipe is required: mrtpo train RECIPE.yaml [--section.key VALUE ...] (for example "
                "recipes/tiny_cpu.yaml; overrides are optional)"
            )
        error(message)

    parser.error = named_error
    format_help = parser.format_help

    def lazy_format_help() -> str:  # the field list imports TRL: only when help is asked for
        if parser.epilog is None:
            parser.epilog = fields_help()
        return format_help()

    parser.format_help = lazy_format_help


def _resume_command(
    args: argparse.Namespace, rest: list[str], threads: int | None, plugins: list[str] = ()
) -> str:
    kept, skip = [f"--plugin={m}" for m in plugins], False
    for tok in rest:
        if skip:
            skip = False
            if not tok.startswith("--"):
                continue
        if tok == "--resume":
            skip = True
            continue
        if tok.startswith("--resume=") or tok in ("--overwrite", "--verbose", "--break-lock"):
            continue
        kept.append(tok)
    if threads is not None:
        kept += ["--threads", str(threads)]
    return shlex.join(["mrtpo", "train", args.config, *kept, "--resume"])


def run(args: argparse.Namespace) -> int:
    import warnings

    from mrtpo.integrations.trl.schema import load_config, parse_overrides
    from mrtpo.plugins import split_plugin_args

    more, rest = split_plugin_args(args.overrides)  # --plugin given after the config
    plugins = [*args.plugin, *more]
    threads = args.threads
    if "--threads" in rest:  # given after the overrides
        i = rest.index("--threads")
        threads, rest = int(rest[i + 1]), rest[:i] + rest[i + 2 :]
    for tok in [t for t in rest if t.startswith("--threads=")]:
        threads = int(tok.partition("=")[2])
        rest.remove(tok)
    if threads is not None and threads < 1:
        raise ValueError(f"--threads must be >= 1, got {threads}")
    print_config = args.print_config
    if "--print-config" in rest:
        rest.remove("--print-config")
        print_config = True
    overwrite = "--overwrite" in rest
    verbose = bool(getattr(args, "verbose", False)) or "--verbose" in rest
    break_lock = bool(getattr(args, "break_lock", False)) or "--break-lock" in rest
    flags = ("--overwrite", "--verbose", "--break-lock")
    pairs, resume = parse_overrides([t for t in rest if t not in flags])
    if resume and overwrite:
        raise ValueError("--resume continues the run folder and --overwrite starts it again: give one")
    with warnings.catch_warnings(record=True) as caught:  # deprecated spellings: one line each
        warnings.simplefilter("always", FutureWarning)
        try:
            cfg = load_config(args.config, pairs, plugins=plugins)  # no torch / transformers / TRL yet
        finally:
            for w in caught:
                print(f"mrtpo train: warning: {w.message}", file=sys.stderr)
    if print_config:
        import yaml

        print(yaml.safe_dump(cfg.resolved(), sort_keys=False).rstrip())
        return 0
    from mrtpo.cli.quiet import WarningTally

    tally = None if verbose else WarningTally().install()
    try:
        return _train(args, cfg, rest, threads, plugins, resume, overwrite, tally, break_lock)
    finally:
        _summarize(tally)


def _summarize(tally) -> None:
    """Stop holding warnings back and print the one-line count (main process; once: a second call does
    nothing)."""
    if tally is None or tally.done:
        return
    tally.uninstall()
    tally.done = True
    line = tally.summary()
    if line and int(os.environ.get("RANK", "0")) == 0:
        print(f"mrtpo train: {line}", file=sys.stderr, flush=True)


def _train(args, cfg, rest, threads, plugins, resume, overwrite, tally, break_lock=False) -> int:
    cfg.check()  # the task, the registries' names, what this machine lacks: one line naming every field
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    from mrtpo.integrations.trl.recipe import TrainingInterrupted, train
    from mrtpo.tasks.faults import VerifierError

    callbacks = []
    if tally is not None:
        import transformers.utils.logging  # noqa: F401  (sets up the handler of transformers' loggers)
        from transformers import TrainerCallback

        tally.cover_handlers()

        class CoverHandlers(TrainerCallback):  # and those set up while the trainer was built
            def on_train_begin(self, args, state, control, **kwargs):
                tally.cover_handlers()

        callbacks.append(CoverHandlers())
    out = cfg.trainer["output_dir"]
    try:
        trainer = train(
            cfg, resume=resume, overwrite=overwrite, break_lock=break_lock, callbacks=callbacks or None
        )
    except VerifierError as e:  # a failed verdict (task.on_verifier_error): one line, the checkpoint, resume
        _close_process_group()
        _summarize(tally)  # before the stop line, which stays the last line
        where = (
            f"saved {e.checkpoint}; resume with: {_resume_command(args, rest, threads, plugins)}"
            if e.checkpoint
            else "no checkpoint was written (no step had completed: the same command starts again in this "
            "folder)"
            if e.step == 0
            else "no checkpoint could be written"
        )
        print(f"mrtpo train: stopped after step {e.step}: {e}; {where}", file=sys.stderr)
        return 1
    except TrainingInterrupted as e:
        _close_process_group()
        _summarize(tally)  # before the resume command, which stays the last line
        where = f"saved {e.checkpoint}" if e.checkpoint else "no checkpoint was written"
        print(
            f"mrtpo train: interrupted at step {e.step}; {where}; resume with: {_resume_command(args, rest, threads, plugins)}",
            file=sys.stderr,
        )
        return 130
    except KeyboardInterrupt:
        from mrtpo.integrations.trl.checkpoints import pick_checkpoint

        _close_process_group()
        _summarize(tally)
        folder, _ = pick_checkpoint(out)
        if folder is None:
            print(
                f"mrtpo train: interrupted; no complete checkpoint in {out}, nothing to resume",
                file=sys.stderr,
            )
        else:
            print(
                f"mrtpo train: interrupted; kept {folder} (later steps are lost); resume with: "
                f"{_resume_command(args, rest, threads, plugins)}",
                file=sys.stderr,
            )
        return 130
    from mrtpo.integrations.trl.vllm import close_engine

    close_engine(trainer)  # a colocated vLLM engine: its teardown needs its process group
    _close_process_group(barrier=True)
    _summarize(tally)
    if trainer is None:  # --resume of a finished run: train() said "already complete at step N"
        return 0
    if trainer.accelerator.is_main_process:  # several processes: one final line
        print(
            f"mrtpo train: {trainer.state.global_step} steps; run folder and final model: {trainer.args.output_dir}"
        )
    return 0


def _close_process_group(barrier: bool = False) -> None:
    """End the launch's process group before the interpreter exits (several processes): left to the exit,
    its threads can be torn down while still joinable, and one process then aborts ("terminate called without
    an active exception") after a run that finished."""
    global ENDED_PROCESS_GROUP
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        if barrier:  # after a finished run every process gets here; after Ctrl-C one may not
            dist.barrier()
        dist.destroy_process_group()
        ENDED_PROCESS_GROUP = True


ENDED_PROCESS_GROUP = False
"""This process ended a launch's process group (``mrtpo.cli.main`` then skips the interpreter's teardown)."""
