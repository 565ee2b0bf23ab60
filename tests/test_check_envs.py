"""scripts/check_envs.py's verdict on a pip report: a resolved version outside a range the project
declares (pyproject under the installed extras, requirements-nodeps.txt, the resolved TRL's vLLM range)
is named; the ranges of extras a set does not install do not apply. Reports are written as pip's
``--report`` writes them, with mrtpo's real requirements (pyproject.toml's, as a wheel's metadata has them)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("packaging")
tomllib = pytest.importorskip("tomllib")  # Python 3.11+
ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "check_envs.py"
spec = importlib.util.spec_from_file_location("check_envs", SCRIPT)
check_envs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_envs)

TRL_VLLM = 'vllm<=0.31.0,>=0.22.0; extra == "vllm"'  # TRL 1.16's own `vllm` extra


def requires_dist() -> list[str]:
    """pyproject.toml's requirements as core metadata writes them (``req; extra == "name"``)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    out = list(project["dependencies"])
    for extra, reqs in project["optional-dependencies"].items():
        for r in reqs:
            req, _, marker = r.partition(";")
            when = f'({marker.strip()}) and extra == "{extra}"' if marker else f'extra == "{extra}"'
            out.append(f"{req.strip()}; {when}")
    return out


def report(extras: list[str], **resolved: str) -> dict:
    meta = {"name": "mrtpo", "version": "0.1.0", "requires_dist": requires_dist()}
    mrtpo = {"metadata": meta, "requested_extras": extras}
    items = [mrtpo]
    for name, version in resolved.items():
        meta = {"name": name.replace("_", "-"), "version": version}
        if name == "trl":
            meta["requires_dist"] = ["transformers>=4.56.2", TRL_VLLM]
        items.append({"metadata": meta})
    return {"install": items}


# what requirements/gpu-trl.txt and gpu-verl.txt resolved to (scripts/check_envs.py, docs/install.md)
TRL_SET = dict(torch="2.13.0", vllm="0.31.0", transformers="5.17.0", trl="1.16.0", accelerate="1.16.0",
               deepspeed="0.19.8", peft="0.21.2")  # fmt: skip
VERL_SET = dict(torch="2.11.0", vllm="0.24.0", transformers="5.9.0", verl="0.9.1", tensordict="0.10.0",
                ray="2.60.0", peft="0.21.2")  # fmt: skip
TRL_EXTRAS = ["train", "vllm", "peft", "deepspeed", "instruct", "tools"]


def test_the_resolved_sets_lie_within_the_declared_ranges():
    assert check_envs.outside(report(TRL_EXTRAS, **TRL_SET)) == []
    # transformers 5.9 is below the `train` extra's floor, which this set does not install
    assert check_envs.outside(report(["verl", "instruct", "tools"], **VERL_SET)) == []


def test_the_cuda_12_set_lies_within_the_declared_ranges_and_has_no_vllm():
    # what requirements/gpu-trl-cu12.txt resolved to (docs/install.md): torch 2.10.0 is PyPI's newest CUDA 12 build
    cu12 = {**TRL_SET, "torch": "2.10.0"}
    cu12.pop("vllm")
    assert check_envs.outside(report(["train", "peft", "deepspeed", "instruct", "tools"], **cu12)) == []
    lines = (check_envs.ROOT / "requirements" / "gpu-trl-cu12.txt").read_text().splitlines()
    pins = [x for x in lines if x and not x.startswith("#")]
    assert "torch==2.10.0" in pins and not any("vllm" in x for x in pins)
    assert "gpu-trl-cu12" in check_envs.SETS


def test_a_version_outside_a_declared_range_is_named():
    bad = report(["vllm"], **{**TRL_SET, "transformers": "5.16.0", "vllm": "0.32.0", "torch": "2.15.0"})
    found = check_envs.outside(bad)
    # `vllm` brings mrtpo[train] with it: its transformers floor applies
    assert any(f.startswith("transformers 5.16.0 lies outside transformers<5.24,>=5.17") for f in found), (
        found
    )
    assert any(
        f.startswith("vllm 0.32.0 lies outside vllm<=0.31.0,>=0.22.0") and "trl 1.16.0[vllm]" in f
        for f in found
    )
    assert any(f.startswith("torch 2.15.0 lies outside torch<2.15,>=2.4") for f in found), found
    assert len(found) == 3, found


def test_the_pins_of_requirements_nodeps_apply_and_uninstalled_extras_do_not():
    found = check_envs.outside(report(["verl"], **{**VERL_SET, "verl": "0.9.0"}))
    assert found == ["verl 0.9.0 lies outside verl==0.9.1 (requirements-nodeps.txt)"]
    found = check_envs.outside(report(["verl"], **{**VERL_SET, "tensordict": "0.11.0"}))
    assert (
        len(found) == 1
        and found[0].startswith("tensordict 0.11.0 lies outside")
        and "pyproject.toml" in found[0]
    )
    # the same tensordict without the `verl` extra: no range of the project applies to it
    assert check_envs.outside(report(["instruct"], **{**VERL_SET, "tensordict": "0.11.0"})) == []
