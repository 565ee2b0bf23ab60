#!/usr/bin/env bash
# Smoke tests of mrtpo against the oldest transformers of the supported range (pyproject: the `train`
# extra's transformers>=5.17,<5.24; 5.17 is what vLLM 0.31 allows, requirements/gpu-trl.txt).
#
#   scripts/test_transformers_versions.sh          # transformers 5.17.0
#   scripts/test_transformers_versions.sh --all    # the whole test suite instead of the smoke tests
#
# A virtual environment .venv-tf5.17.0 holds only transformers 5.17.0 and the huggingface_hub 1.x it
# requires (hub 2.x, which the project's .venv has, is outside its `<2.0`), with httpx / httpcore, which
# hub 1.x imports (pip install --no-deps); every other package comes from the project's .venv (the
# README's install), so it sets up in seconds and differs from the main run in those packages alone.
# The smoke tests: model loading, the replay engine on Hugging Face models, the TRL seams, the trainer
# (not the tests marked slow, the multi-process runs) and the shipped description of TRL's fields.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || { echo "scripts/test_transformers_versions.sh: run the README's install first (.venv)" >&2; exit 2; }
all=0
if [ "${1:-}" = --all ]; then all=1; shift; fi
v=5.17.0
pins=("transformers==$v" "huggingface_hub==1.33.0" "httpx==0.29.0" "httpcore==1.0.9")
base=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
env=".venv-tf$v"
if [ ! -x "$env/bin/python" ]; then
  python3 -m venv "$env"
  site=$("$env/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  # the project's packages after this environment's own (its transformers comes first on sys.path)
  echo "import site; site.addsitedir('$base')" > "$site/zz_mrtpo_project.pth"
  "$env/bin/python" -m pip install -q --no-deps "${pins[@]}"
fi
got=$("$env/bin/python" -c "import transformers, huggingface_hub; print(transformers.__version__, huggingface_hub.__version__)")
[ "$got" = "$v 1.33.0" ] || { echo "transformers $v: the environment imports transformers / huggingface_hub $got" >&2; exit 1; }
echo "== transformers $v (huggingface_hub 1.33.0)"
if [ "$all" = 1 ]; then
  "$env/bin/python" -m pytest -q -p no:cacheprovider
else
  "$env/bin/python" -m pytest -q -p no:cacheprovider -m "not slow" tests/models/test_loading.py \
    tests/replay/test_engine.py tests/integrations/trl/test_seams.py tests/integrations/trl/test_trainer.py \
    tests/integrations/trl/test_trl_fields.py
fi
