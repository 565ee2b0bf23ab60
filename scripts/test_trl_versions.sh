#!/usr/bin/env bash
# Smoke tests of mrtpo against other TRL releases of the supported range (pyproject: trl>=1.14,<1.17).
#
#   scripts/test_trl_versions.sh            # the oldest supported release, 1.14.2 (what .ci/run calls)
#   scripts/test_trl_versions.sh 1.15.0 1.14.2
#   scripts/test_trl_versions.sh --all 1.14.2   # also the slow multi-process tests (several minutes)
#
# For each version a virtual environment .venv-trl<version> holds only that TRL release (pip install
# --no-deps) and reads every other package from the project's .venv (the README's install), so the
# check takes seconds to set up and differs from the main run in TRL alone. It runs the tests of the
# TRL seams, the trainer, the baselines and the sharded trainer paths (without --all: not the tests
# marked slow, the multi-process runs), and two configuration-matrix cells with TRL's defaults (bf16
# on; LoRA; two processes: the multi-process path on every run).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || { echo "scripts/test_trl_versions.sh: run the README's install first (.venv)" >&2; exit 2; }
marker=(-m "not slow")
if [ "${1:-}" = --all ]; then marker=(); shift; fi
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(1.14.2)
base=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
for v in "${versions[@]}"; do
  env=".venv-trl$v"
  if [ ! -x "$env/bin/python" ]; then
    python3 -m venv "$env"
    site=$("$env/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    # the project's packages after this environment's own (its TRL comes first on sys.path)
    echo "import site; site.addsitedir('$base')" > "$site/zz_mrtpo_project.pth"
    "$env/bin/python" -m pip install -q --no-deps "trl==$v"
  fi
  got=$("$env/bin/python" -c "import trl; print(trl.__version__)")
  [ "$got" = "$v" ] || { echo "TRL $v: the environment imports trl $got" >&2; exit 1; }
  echo "== TRL $got"
  "$env/bin/python" -m pytest -q -p no:cacheprovider ${marker[@]+"${marker[@]}"} tests/integrations/trl/test_seams.py \
    tests/integrations/trl/test_trainer.py tests/integrations/trl/test_baselines.py tests/integrations/trl/test_vllm.py \
    tests/integrations/trl/test_distributed.py tests/integrations/trl/test_trl_fields.py
  "$env/bin/python" -m mrtpo.integrations.trl.matrix --cells single/bf16/lora/reward ddp/bf16/full/cort
done
