#!/usr/bin/env bash
# Wheels for scripts/gpu_check.sh on a GPU machine without a package index (Python 3.12, x86-64): everything
# the TRL, DeepSpeed and LoRA steps import beyond an image that has torch and transformers (with their own
# dependencies) and pyarrow and pandas, each wheel named here with its version and no dependency resolved
# on the GPU machine; the check at the end fails when a shipped package needs something neither shipped
# nor on that image.
#
#   scripts/gpu_wheels.sh            # into .whl/ (git-ignored); then on the GPU machine:
#   scripts/gpu_check.sh --wheels .whl
#   scripts/gpu_wheels.sh DIR --full # also pyarrow and pandas (for an image with torch and transformers only;
#                                    # about 67 MiB more: over the 64 MiB a device machine takes)
#
# DeepSpeed ships as a source archive only: gpu_check.sh builds it there against the machine's CUDA torch
# (with ninja, shipped here); its PKG-INFO's requirements are checked as a wheel's are.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST="${1:-.whl}"
FULL=0
[ "${2:-}" = "--full" ] && FULL=1
PY="${PYTHON:-.venv/bin/python}"
mkdir -p "$DEST"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
wheels=(
  "trl==1.16.0" "accelerate==1.16.0" "peft==0.21.2" "datasets==5.2.0" "dill==0.4.1" "multiprocess==0.70.19"
  "xxhash==4.1.0" "psutil==7.2.2"
  # DeepSpeed's requirements (its sdist's PKG-INFO): einops hjson msgpack ninja numpy packaging psutil
  # py-cpuinfo pydantic torch tqdm
  "einops==0.8.2" "hjson==3.1.0" "msgpack==1.2.4" "ninja==1.13.2" "py-cpuinfo==9.0.0"
  "pydantic==2.14.4" "pydantic-core==2.50.5" "annotated-types==0.8.0" "typing-inspection==0.4.5"
)
if [ "$FULL" = 1 ]; then
  wheels+=("pyarrow==26.0.1" "pandas==2.3.3" "python-dateutil==4.0.0" "six==1.17.0" "pytz==2026.6" "tzdata==2026.6")
fi
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d "$DEST" "${wheels[@]}"
"$PY" -m pip download -q --no-deps --no-binary=:all: -d "$DEST" "deepspeed==0.19.8"
# The set must fit the GPU machine's 64 MiB of extra files, and every wheel must accept what that image
# has (Python 3.12, torch 2.11, transformers 5.17): each Requires-Dist is checked against those versions
# and the other wheels here; what neither provides is listed as assumed present on the image.
"$PY" - "$DEST" "$FULL" <<'PYEOF'
import sys, tarfile, zipfile
from email.parser import Parser
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

dest, full = Path(sys.argv[1]), sys.argv[2] == "1"
IMAGE = {"python": "3.12", "torch": "2.11.0", "transformers": "5.17.0"}
# what the image brings besides: torch's and transformers' own requirements (and huggingface_hub's), by
# name; pyarrow and pandas too unless --full ships them (pyarrow's wheel alone is about 52 MiB)
ON_IMAGE = {"torch", "transformers", "filelock", "typing-extensions", "setuptools", "sympy", "networkx", "jinja2",
            "fsspec", "huggingface-hub", "numpy", "packaging", "pyyaml", "regex", "tokenizers", "typer",
            "safetensors", "tqdm", "click", "hf-xet", "httpx", "httpx2"}
if not full:
    ON_IMAGE |= {"pyarrow", "pandas"}
LIMIT = 64 * 2**20
files = sorted(p for p in dest.iterdir() if p.suffix in (".whl", ".gz"))
total = sum(p.stat().st_size for p in files)
here = {}
for p in files:
    if p.suffix == ".whl":
        name, ver, _, _ = parse_wheel_filename(p.name)
        here[canonicalize_name(name)] = ver
    else:  # a source archive: name-version.tar.gz
        name, _, ver = p.name.removesuffix(".tar.gz").rpartition("-")
        here[canonicalize_name(name)] = Version(ver)
env = {**default_environment(), "python_version": IMAGE["python"], "python_full_version": IMAGE["python"] + ".0",
       "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "extra": ""}
bad, assumed = [], set()
def metadata(p):
    if p.suffix == ".whl":
        with zipfile.ZipFile(p) as z:
            name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            return Parser().parsestr(z.read(name).decode())
    with tarfile.open(p) as t:  # the sdist's PKG-INFO, at its top folder
        name = next(n for n in t.getnames() if n.count("/") == 1 and n.endswith("/PKG-INFO"))
        return Parser().parsestr(t.extractfile(name).read().decode())


for p in files:
    meta = metadata(p)
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
            if name not in ON_IMAGE:
                bad.append(f"{p.name}: requires {req}, neither shipped here nor on the image")
            assumed.add(req.name + (str(req.specifier) or ""))
        elif have not in req.specifier:
            bad.append(f"{p.name}: requires {req}, the image/wheels have {name} {have}")
print(f"gpu_wheels: {len(files)} files, {total / 2**20:.1f} MiB of the 64 MiB the GPU machine takes")
print("gpu_wheels: assumed present on the image: " + ", ".join(sorted(assumed)))
if total > LIMIT and not full:
    bad.append(f"the set is {total / 2**20:.1f} MiB, over 64 MiB")
for b in bad:
    print(f"gpu_wheels: {b}", file=sys.stderr)
sys.exit(1 if bad else 0)
PYEOF
