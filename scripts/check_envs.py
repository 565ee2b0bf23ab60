#!/usr/bin/env python3
"""Re-check that pip's resolver accepts the GPU environments, and print what each one selects.

    .venv/bin/python scripts/check_envs.py                 # all five resolutions (a few minutes)
    .venv/bin/python scripts/check_envs.py --sets gpu-trl,gpu-verl --json envs.json

For each set, ``pip install --dry-run --ignore-installed --report`` resolves it from PyPI as a CUDA
machine would (nothing is installed, no CUDA wheel is unpacked) and the script prints the resolved
versions of the key packages in one table. The sets:

    gpu-trl      requirements/gpu-trl.txt (the TRL route's tested pins: CUDA torch, vLLM, TRL, ...)
    trl-ranges   -e .[train,vllm,peft,deepspeed]: what the package's own ranges select today
    gpu-trl-cu12 requirements/gpu-trl-cu12.txt (the TRL route for CUDA 12 drivers: torch 2.10.0, no vLLM)
    gpu-verl     requirements/gpu-verl.txt (the verl route's pins: verl[vllm]==0.9.1 and the `verl` extra)
    verl-ranges  -e .[verl] verl[vllm]==0.9.1: what verl's pins and the `verl` extra select today

It fails (exit 1) when a set does not resolve, or when a resolved key package lies outside a range the
project declares for it: mrtpo's own requirements under the extras the set installs (pyproject.toml),
the pins of requirements-nodeps.txt (verl==0.9.1), and the vLLM range of the resolved TRL's `vllm`
extra. A "ranges" set that selects something newer than its pinned set is reported as drift (exit 0):
time to test the newer release and move the pins.

It needs PyPI. By default it ignores this machine's pip configuration (a constraints file capping torch,
local CPU wheels), which would distort a CUDA resolution: ``--keep-pip-config`` keeps it (a private index).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
KEY = [
    "torch",
    "cuda-toolkit",
    "nvidia-cuda-runtime-cu12",
    "vllm",
    "transformers",
    "tokenizers",
    "trl",
    "accelerate",
    "deepspeed",
    "peft",
    "verl",
    "tensordict",
    "ray",
]
SETS = {
    "gpu-trl": (["-r", "requirements/gpu-trl.txt"], None),
    "trl-ranges": (["-e", ".[train,vllm,peft,deepspeed]"], "gpu-trl"),
    "gpu-trl-cu12": (["-r", "requirements/gpu-trl-cu12.txt"], None),
    "gpu-verl": (["-r", "requirements/gpu-verl.txt"], None),
    "verl-ranges": (["-e", ".[verl]", "verl[vllm]==0.9.1"], "gpu-verl"),
}


def resolve(args: list[str], pip: list[str], keep_config: bool) -> tuple[dict | None, str, float]:
    """One dry run: (pip's report or None, pip's last lines, seconds)."""
    env = dict(os.environ)
    if not keep_config:
        env.update(PIP_CONFIG_FILE=os.devnull, PIP_FIND_LINKS="", PIP_CONSTRAINT="", PIP_EXTRA_INDEX_URL="")
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [*pip, "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report), *args]
        t0 = time.monotonic()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        seconds = time.monotonic() - t0
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-12:])
        if proc.returncode != 0 or not report.exists():
            return None, tail, seconds
        return json.loads(report.read_text()), tail, seconds


def nodeps_pins() -> list[Requirement]:
    lines = (ROOT / "requirements-nodeps.txt").read_text().splitlines()
    return [Requirement(s) for s in (ln.split("#")[0].strip() for ln in lines) if s]


def declared(report: dict) -> list[tuple[str, Requirement]]:
    """(where, requirement) for every range the project declares that applies to this resolution."""
    items = {canonicalize_name(i["metadata"]["name"]): i for i in report["install"]}
    env = dict(default_environment())
    out: list[tuple[str, Requirement]] = []
    mrtpo = items.get("mrtpo")
    if mrtpo is not None:
        extras = set(mrtpo.get("requested_extras") or [])
        # an extra that names mrtpo's own extras (vllm -> train) brings theirs in
        reqs = [Requirement(r) for r in mrtpo["metadata"].get("requires_dist", [])]
        changed = True
        while changed:
            changed = False
            for r in reqs:
                if canonicalize_name(r.name) != "mrtpo":
                    continue
                if any(r.marker is None or r.marker.evaluate({**env, "extra": e}) for e in extras | {""}):
                    new = set(r.extras) - extras
                    if new:
                        extras |= new
                        changed = True
        for r in reqs:
            if canonicalize_name(r.name) == "mrtpo":
                continue
            if r.marker is None or any(r.marker.evaluate({**env, "extra": e}) for e in extras | {""}):
                out.append(("pyproject.toml", r))
    for r in nodeps_pins():
        if canonicalize_name(r.name) in items:
            out.append(("requirements-nodeps.txt", r))
    trl = items.get("trl")
    if trl is not None and "vllm" in items:
        for s in trl["metadata"].get("requires_dist", []):
            r = Requirement(s)
            in_extra = r.marker is not None and r.marker.evaluate({**env, "extra": "vllm"})
            if canonicalize_name(r.name) == "vllm" and in_extra:
                out.append((f"trl {trl['metadata']['version']}[vllm]", r))
    return out


def outside(report: dict) -> list[str]:
    """Every resolved package whose version lies outside a range the project declares for it."""
    got = versions(report)
    out = []
    for where, req in declared(report):
        v = got.get(canonicalize_name(req.name))
        if v is not None and not req.specifier.contains(Version(v), prereleases=True):
            out.append(f"{req.name} {v} lies outside {req} ({where})")
    return out


def versions(report: dict) -> dict[str, str]:
    return {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in report["install"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sets", default=",".join(SETS), help=f"comma-separated, of {', '.join(SETS)}")
    p.add_argument("--pip", default=None, help="the pip to resolve with (default: this Python's pip)")
    p.add_argument("--keep-pip-config", action="store_true", help="keep this machine's pip configuration")
    p.add_argument("--json", default=None, help="write the resolved versions and the verdicts to this file")
    a = p.parse_args(argv)
    names = [s.strip() for s in a.sets.split(",") if s.strip()]
    unknown = [s for s in names if s not in SETS]
    if unknown:
        p.error(f"--sets: unknown set {unknown[0]!r} (known: {', '.join(SETS)})")
    pip = a.pip.split() if a.pip else [sys.executable, "-m", "pip"]

    print(
        f"resolving for Python {platform.python_version()} on {sys.platform} {platform.machine()}", flush=True
    )
    results: dict[str, dict] = {}
    failures: list[str] = []
    for name in names:
        args, _ = SETS[name]
        print(f"  {name}: pip install --dry-run {' '.join(args)} ...", end="", flush=True)
        report, tail, seconds = resolve(args, pip, a.keep_pip_config)
        print(f" {seconds:.0f} s", flush=True)
        if report is None:
            failures.append(f"{name}: does not resolve:\n{tail}")
            results[name] = {"resolved": False, "error": tail}
            continue
        got = versions(report)
        failures += [f"{name}: {v}" for v in outside(report)]
        results[name] = {"resolved": True, "versions": {k: got[k] for k in KEY if k in got}}

    width = max(12, *(len(k) for k in KEY))
    cols = [max(len(n), 11) for n in names]
    print()
    print(f"{'package':<{width}}  " + "  ".join(f"{n:<{c}}" for n, c in zip(names, cols)))
    print("-" * (width + sum(c + 2 for c in cols)))
    for k in KEY:
        row = []
        for n, c in zip(names, cols):
            r = results[n]
            cell = "FAILED" if not r["resolved"] else r["versions"].get(k, "-")
            row.append(f"{cell:<{c}}")
        if any(cell.strip() != "-" for cell in row):
            print(f"{k:<{width}}  " + "  ".join(row))

    drift = []
    for n in names:
        pinned = SETS[n][1]
        if pinned in results and results[n]["resolved"] and results[pinned]["resolved"]:
            for k, v in results[n]["versions"].items():
                w = results[pinned]["versions"].get(k)
                if w is not None and Version(v) > Version(w):
                    drift.append(f"{n} selects {k} {v}, {pinned} pins {w}")
    print()
    for d in drift:
        print(f"drift: {d}")
    for f in failures:
        print(f"FAIL {f}")
    if not failures:
        print(f"all {len(names)} sets resolve within the declared ranges")
    if a.json:
        Path(a.json).write_text(json.dumps({"sets": results, "drift": drift, "failures": failures}, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
