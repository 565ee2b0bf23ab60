"""Options shared by ``mrtpo launch`` and ``mrtpo plan``: both take ``RECIPE [options] [-- OVERRIDES]``."""

from __future__ import annotations

import argparse


def recipe_arguments(
    parser: argparse.ArgumentParser, add_options, examples: list[str], rest_help: str
) -> None:
    """``RECIPE [options] [-- OVERRIDES]`` on ``parser``: the recipe, the command's options (``add_options``),
    the overrides after ``--`` (``rest_help``), and ``examples`` (one command a line) as its epilog."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "\n".join(["examples:", *(f"  {e}" for e in examples)])
    parser.add_argument("recipe", help="a mrtpo train recipe or a verl recipe (recipes/*.yaml)")
    add_options(parser)
    parser.add_argument("rest", nargs=argparse.REMAINDER, metavar="-- OVERRIDES", help=rest_help)


def late_options(args: argparse.Namespace, add_options, command: str) -> list[str]:
    """Options given after the recipe (which ``args.rest`` swallowed) go into ``args``; the overrides
    (after ``--``, or options that name a config key) are returned."""
    rest = list(args.rest)
    if "--" in rest:
        i = rest.index("--")
        before, after = rest[:i], rest[i + 1 :]
    else:
        before, after = rest, []
    late = argparse.ArgumentParser(prog=f"mrtpo {command}", add_help=False)
    add_options(late)
    defaults = {a.dest: a.default for a in late._actions}
    got, unknown = late.parse_known_args(before)
    for key, value in vars(got).items():
        if value != defaults.get(key):
            setattr(args, key, value)
    if unknown:  # options after the recipe that are not the command's: overrides without the `--`
        if not unknown[0].startswith("--") or "." not in unknown[0].split("=")[0]:
            raise ValueError(
                f"unknown argument {unknown[0]!r}; overrides for the recipe go after --: "
                f"mrtpo {command} RECIPE --gpus 8 -- --trl.max_steps 5"
            )
        after = unknown + after
    return after
