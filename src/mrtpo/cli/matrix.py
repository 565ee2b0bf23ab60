"""``mrtpo matrix``: train every configuration cell (engine x precision x adapter x credit x loss) for a
few steps and check its replay against a float32 reference (:mod:`mrtpo.integrations.trl.matrix`)."""

from __future__ import annotations


def add_arguments(parser) -> None:
    from mrtpo.integrations.trl.matrix import add_arguments as add

    add(parser)


def run(args) -> int:
    from mrtpo.integrations.trl.matrix import run_from_args

    return run_from_args(args)
