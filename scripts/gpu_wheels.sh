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
du -sh "$DEST"
