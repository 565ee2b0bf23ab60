"""mrtpo.registry: one error type, UnknownName, for every registry miss; it lists the known names and
the closest one."""

from __future__ import annotations

import pytest

from mrtpo.registry import Registry, UnknownName


def test_lookup_miss_lists_names_and_the_closest_one():
    reg: Registry[int] = Registry("colour")
    reg.register("green")(1)
    reg.register("red")(2)
    assert reg.get("red") == 2 and reg.names() == ["green", "red"] and "red" in reg
    with pytest.raises(UnknownName) as e:
        reg.get("gren")
    assert str(e.value) == "unknown colour 'gren'; known: green, red (did you mean 'green'?)"
    assert (e.value.kind, e.value.name, e.value.known) == ("colour", "gren", ["green", "red"])
    # both a failed lookup and a bad value: callers catching either see it
    assert isinstance(e.value, KeyError) and isinstance(e.value, ValueError)
    with pytest.raises(UnknownName, match=r"^unknown colour 'blue'; known: green, red$"):  # nothing close
        reg.get("blue")
    with pytest.raises(
        UnknownName, match=r"^unknown colour \['red'\]; known: green, red \(did you mean 'red'"
    ):
        reg.get(["red"])
    assert reg.remove("green") == 1
    with pytest.raises(UnknownName, match=r"^unknown colour 'green'; known: red$"):
        reg.remove("green")
    with pytest.raises(ValueError, match="colour 'red' is already registered"):
        reg.register("red")(3)
    with pytest.raises(UnknownName, match=r"^unknown thing 'x'; known: \(none\)$"):
        Registry("thing").get("x")


def test_every_registry_of_the_package_raises_it():
    import mrtpo.eval.ifeval  # noqa: F401  (registers the benchmark "ifeval")
    from mrtpo import advantages, credit
    from mrtpo.eval.benchmark import BENCHMARKS
    from mrtpo.replay import service
    from mrtpo.tasks import load_task
    from mrtpo.tasks.instruct.muldimif import CHECKS

    misses = {
        "advantage method 'gpdo'": lambda: advantages.compute("gpdo", [[1.0], [0.0]], [0, 0]),
        "credit scheme 'rewrad'": lambda: credit.scheme("rewrad"),
        "replay kind 'rewards'": lambda: service.replay_kind("rewards"),
        "task 'tyo'": lambda: load_task("tyo"),
        "benchmark 'ifevl'": lambda: BENCHMARKS.get("ifevl"),
        "MulDimIF check 'tables'": lambda: CHECKS.get("tables"),
    }
    for what, call in misses.items():
        with pytest.raises(UnknownName, match=rf"^unknown {what}; known: .*\(did you mean '\w+'\?\)$"):
            call()
