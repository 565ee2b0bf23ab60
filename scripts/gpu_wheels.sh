#!/usr/bin/env bash
# Wheels for scripts/gpu_check.sh on a GPU machine without a package index (Python 3.12, x86-64, with
# torch, transformers, accelerate, peft, pyarrow, pandas, ... already there): what the TRL and DeepSpeed
# steps need beyond that image, no dependencies resolved (each one is named here).
#
#   scripts/gpu_wheels.sh            # into .whl/ (git-ignored); then on the GPU machine:
#   scripts/gpu_check.sh --wheels .whl
#
# DeepSpeed ships as a source archive only: gpu_check.sh builds it there against the machine's CUDA torch.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST="${1:-.whl}"
PY="${PYTHON:-.venv/bin/python}"
mkdir -p "$DEST"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
wheels=(
  "trl==1.16.0" "datasets==5.2.0" "dill==0.4.1" "multiprocess==0.70.19"
  "hjson==3.1.0" "pydantic==2.14.4" "pydantic-core==2.50.5" "annotated-types==0.8.0"
  "typing-inspection==0.4.5"
)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d "$DEST" "${wheels[@]}"
"$PY" -m pip download -q --no-deps --no-binary=:all: -d "$DEST" "deepspeed==0.19.8"
# The set must fit the GPU machine's 64 MiB of extra files, and every wheel must accept what that image
# has (Python 3.12, torch 2.11, transformers 5.17): each Requires-Dist is checked against those versions
# and the other wheels here; what neither provides is listed as assumed present on the image.
"$PY" - "$DEST" <<'PYEOF'
import sys, zipfile
from email.parser import Parser
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

dest = Path(sys.argv[1])
IMAGE = {"python": "3.12", "torch": "2.11.0", "transformers": "5.17.0"}
LIMIT = 64 * 2**20
files = sorted(p for p in dest.iterdir() if p.suffix in (".whl", ".gz"))
total = sum(p.stat().st_size for p in files)
here = {}
for p in files:
    if p.suffix == ".whl":
        name, ver, _, _ = parse_wheel_filename(p.name)
        here[canonicalize_name(name)] = ver
env = {**default_environment(), "python_version": IMAGE["python"], "python_full_version": IMAGE["python"] + ".0",
       "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "extra": ""}
bad, assumed = [], set()
for p in files:
    if p.suffix != ".whl":
        continue
    with zipfile.ZipFile(p) as z:
        meta_name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(z.read(meta_name).decode())
    rp = meta.get("Requires-Python")
    if rp and Version(IMAGE["python"] + ".0") not in Requirement(f"python{rp}").specifier:
        bad.append(f"{p.name}: Requires-Python {rp} excludes Python {IMAGE['python']}")
    for line in meta.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        name = canonicalize_name(req.name)
        have = IMAGE.get(name) if name in ("torch", "transformers") else None
        have = Version(have) if have else here.get(name)
        if have is None:
            assumed.add(req.name + (str(req.specifier) or ""))
        elif have not in req.specifier:
            bad.append(f"{p.name}: requires {req}, the image/wheels have {name} {have}")
print(f"gpu_wheels: {len(files)} files, {total / 2**20:.1f} MiB of the 64 MiB the GPU machine takes")
print("gpu_wheels: assumed present on the image: " + ", ".join(sorted(assumed)))
if total > LIMIT:
    bad.append(f"the set is {total / 2**20:.1f} MiB, over 64 MiB")
for b in bad:
    print(f"gpu_wheels: {b}", file=sys.stderr)
sys.exit(1 if bad else 0)
PYEOF
