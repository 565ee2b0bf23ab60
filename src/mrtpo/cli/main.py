"""``mrtpo`` entry point: dispatches ``mrtpo <command> [<subcommand>] ...`` to ``mrtpo.cli.<module>``."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

# (command words) -> (module under mrtpo.cli, one-line help)
COMMANDS: dict[tuple[str, ...], tuple[str, str]] = {
    ("demo",): (
        "demo",
        "train GRPO, GDPO and MRTPO on a tiny synthetic task and write a report (no downloads)",
    ),
    ("data",): (
        "data",
        "the datasets the recipes read: sources, licences, counts; check and write what you downloaded",
    ),
    ("train",): ("train", "train a model from a YAML config with command-line overrides"),
    ("launch",): ("launch", "print and run the one command that starts a recipe on GPUs or CPU processes"),
    ("plan",): ("plan", "memory per GPU and time per step of a recipe, offline: does it fit?"),
    ("explain",): ("explain", "per-token credit of one response: HTML + PNG"),
    ("report",): ("report", "curves, steps-to-threshold and localization tables from training runs"),
    ("eval",): ("eval", "score a model or saved responses on a benchmark (sql, bfcl, ifeval, ifbench, ...)"),
    ("matrix",): (
        "matrix",
        "train every engine x precision x adapter x credit cell a few steps; replay vs float32",
    ),
    ("bench", "replay"): ("bench_replay", "naive vs chunked replay: time, memory, FPE, max difference"),
    ("bench", "advantages"): (
        "bench_advantages",
        "time and peak memory of every advantage method at N and N/2 responses, against a budget",
    ),
    ("bench", "train"): ("bench_train", "per-step time of MRTPO vs GDPO vs TRL's GDPO mode"),
    ("bench", "sql"): ("bench_sql", "SQL verifier throughput through the sandbox pool"),
    ("bench", "verifiers"): ("bench_verifiers", "time of one verdict on adversarial responses"),
    ("bench", "soak"): ("bench_soak", "a long training run: resident memory growth and run-folder size"),
}


def _available() -> dict[tuple[str, ...], tuple[str, str]]:
    out = {}
    for words, (module, help_) in COMMANDS.items():
        if importlib.util.find_spec(f"mrtpo.cli.{module}") is not None:
            out[words] = (module, help_)
    return out


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mrtpo")
    except PackageNotFoundError:
        return "unknown (not installed)"


GROUPS = {
    "bench": "benchmarks that print figures: replay, advantages, training step, SQL sandbox, verifiers, a soak",
}
"""What a command of several words does, for ``mrtpo --help``."""


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The command line's parser. With ``argv``, only the command it names gets its options (its module is
    imported); the others are listed by name and help alone, so ``mrtpo train --help`` does not import
    every command's dependencies. Without ``argv``, every command is complete."""
    parser = argparse.ArgumentParser(
        prog="mrtpo",
        description="Multi-reward RL with token-level credit (MRTPO).",
        epilog="Run `mrtpo COMMAND --help` for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"mrtpo {_version()}")
    top = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    groups: dict[str, argparse._SubParsersAction] = {}
    for words, (module, help_) in _available().items():
        if len(words) == 1:
            sub = top.add_parser(words[0], help=help_, description=help_)
        else:
            if words[0] not in groups:
                what = GROUPS.get(words[0], f"{words[0]} commands")
                g = top.add_parser(words[0], help=what, description=what)
                groups[words[0]] = g.add_subparsers(dest="subcommand", metavar="SUBCOMMAND", required=True)
            sub = groups[words[0]].add_parser(words[1], help=help_, description=help_)
        if argv is None or _names(argv, words):
            mod = importlib.import_module(f"mrtpo.cli.{module}")
            mod.add_arguments(sub)
        sub.set_defaults(_module=module, _words=words)
    return parser


def _names(argv: list[str], words: tuple[str, ...]) -> bool:
    """``argv`` runs the command ``words`` (its first positional words are those)."""
    given = [a for a in argv if not a.startswith("-")][: len(words)]
    return tuple(given) == tuple(words)


# where a missing package comes from (the verl route's environment, for one, has no TRL)
_TRAIN = 'pip install -e ".[train]"; docs/install.md'
_INSTALL = {
    **dict.fromkeys(["trl", "transformers", "accelerate", "datasets", "tokenizers"], _TRAIN),
    "vllm": 'pip install -e ".[vllm]" on a CUDA machine: requirements/gpu-trl.txt',
    "deepspeed": 'pip install -e ".[deepspeed]"',
    "peft": 'pip install -e ".[peft]"',
    "verl": "requirements/gpu-verl.txt, or pip install --no-deps -r requirements-nodeps.txt",
}


def main(argv: list[str] | None = None) -> int:
    argv_given = argv
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    if not argv:  # `mrtpo` alone: the commands
        parser.print_help()
        return 0
    args = parser.parse_args(argv)
    mod = importlib.import_module(f"mrtpo.cli.{args._module}")

    def name() -> str:  # read late: a command may refine its words (`mrtpo eval NAME`)
        return f"mrtpo {' '.join(args._words)}"

    try:
        rc = int(mod.run(args) or 0)
    except (ValueError, FileNotFoundError, FileExistsError, KeyError) as e:  # user errors: one line
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"{name()}: error: {' '.join(str(msg).split())}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # a failed verdict that stopped training (mrtpo.tasks.faults): one line
        from mrtpo.tasks.faults import VerifierError

        if not isinstance(e, VerifierError):
            raise
        print(f"{name()}: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as e:  # a package of an extra that this environment does not have
        top = (e.name or "").split(".")[0]
        if not top or top == "mrtpo":
            raise
        where = _INSTALL.get(top, "docs/install.md")
        print(
            f"{name()}: error: needs the package '{top}', which is not installed ({where})", file=sys.stderr
        )
        return 2
    except KeyboardInterrupt:
        print(f"{name()}: interrupted", file=sys.stderr)
        return 130
    if argv_given is None:  # the process's entry point (not a call from Python)
        _exit_after_launch(rc)
    return rc


def _exit_after_launch(rc: int) -> None:
    """End a process of a multi-process launch that closed its process group with ``rc`` without the
    interpreter's teardown. Its exit handlers run and its output is flushed; what is skipped is the
    destruction of torch's and DeepSpeed's native objects, where one rank of a finished 2-process ZeRO-3
    run aborted ("terminate called without an active exception", SIGABRT), failing the launch after its
    last step and final model were written."""
    import os

    train = sys.modules.get("mrtpo.cli.train")
    if train is None or not getattr(train, "ENDED_PROCESS_GROUP", False):
        return
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    import atexit
    import logging

    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


if __name__ == "__main__":
    sys.exit(main())
