#!/usr/bin/env bash
# The README's picture (docs/img/explain.png): `mrtpo demo --quick`'s first warm start, 10 MRTPO steps of the
# demo's recipe on it, then `mrtpo explain` of the record with the largest |Â|. CPU, no download, a few minutes.
# usage: scripts/readme_figure.sh [WORKDIR]   (default: a temporary folder; the PNG is copied to docs/img/)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:-$(mktemp -d)}"
mkdir -p "$work" && cd "$work"
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1
mrtpo demo --quick --threads 1 --no-progress --output demo
mrtpo train "$repo/recipes/toy_mrtpo.yaml" --model.path demo/warmstart/ws0 --trl.max_steps 10 \
  --trl.output_dir runs/toy_mrtpo --threads 1 --overwrite
mrtpo explain --samples runs/toy_mrtpo/samples.jsonl --out explain/
mkdir -p "$repo/docs/img"
cp explain/*.png "$repo/docs/img/explain.png"
echo "wrote $repo/docs/img/explain.png"
