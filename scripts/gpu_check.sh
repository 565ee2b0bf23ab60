#!/usr/bin/env bash
# The checks only a GPU can run, in one go, ending with one table. Each step has a time limit (120 +
# 120 + 60 + 60 + 120 s: at most 8 minutes in all); a step that fails or runs out of time is a row saying so.
#   1. mrtpo bench replay  (naive float32 vs mrtpo replay, float64 reference, projection dtypes)
#   2. mrtpo bench train   (per-step time of TRL GDPO, mrtpo GDPO, mrtpo MRTPO)
#   3. FSDP2 replay        (gather and lockstep vs an unsharded copy; one process per GPU, NCCL)
#   4. distance kernels    (eager vs fused JS distances at the config's V and H, float32 and bfloat16
#                           projection; the table adds the share of the MRTPO step spent on replay)
#   5. matrix              (the trainer with TRL's bf16 autocast, LoRA, CoRT, OPSD, and under ZeRO-3 with
#                           one process per GPU, each cell's replay checked against float32: mrtpo matrix)
#
#   scripts/gpu_check.sh                                 # cuda, random Qwen2.5-7B shapes
#   scripts/gpu_check.sh --config qwen2.5-3b
#   scripts/gpu_check.sh --device cpu --config tiny      # the same steps on CPU (gloo, 2 processes)
#
# Options: --device cuda|cpu, --config tiny|qwen2.5-3b|qwen2.5-7b, --out DIR (default: a new temp dir),
# --nproc N (processes of steps 3 and 4; default: the GPUs nvidia-smi lists, 2 on CPU). PYTHON selects
# the interpreter (default: python). Each step's log and JSON stay in the output directory.
#
# On a machine with torch but without the project's install (a GPU image: torch, transformers, accelerate
# and peft, no trl, datasets or deepspeed, no package index), run from the repository root with
# PYTHONPATH=src: steps 1 and 3 need torch and transformers only; steps 2 and 4 need the wheels that
# scripts/gpu_wheels.sh prepares on a machine with an index (.whl/, installed with --no-deps into
# /tmp/site by --wheels .whl). The project's version pins are not enforced there (nothing is pip-installed
# from pyproject.toml): that image's transformers 5.17 is the `train` extra's floor (>=5.17), and its
# torch 2.11 lies inside the declared range.
set -u
DEVICE=cuda
CONFIG=qwen2.5-7b
OUT=""
NPROC=""
WHEELS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE="$2"; shift 2 ;;
    --config) CONFIG="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --nproc) NPROC="$2"; shift 2 ;;
    --wheels) WHEELS="$2"; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
PY="${PYTHON:-python}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
OUT="${OUT:-$(mktemp -d -t mrtpo-gpu-check-XXXXXX)}"
if [ -n "$WHEELS" ]; then  # wheels of scripts/gpu_wheels.sh (and DeepSpeed's source, built here)
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$WHEELS"/*.whl || { echo "gpu_check: installing $WHEELS failed" >&2; exit 1; }
  for sdist in "$WHEELS"/*.tar.gz; do
    [ -e "$sdist" ] || continue
    PYTHONPATH=/tmp/site "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site "$sdist" \
      || echo "gpu_check: building $sdist failed (its step will say so)" >&2
  done
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
[ -d src/mrtpo ] && export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"
: > "$OUT/status.tsv"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ "$DEVICE" = cpu ]; then
  export ACCELERATE_USE_CPU=true OMP_NUM_THREADS=1
  NPROC="${NPROC:-2}"
  REPLAY_ARGS=(--t 128 --threads 2 --kernels fused)  # eager vs fused: the distance-kernels step
  TRAIN_ARGS=(--steps 3 --warmup 1 --repeats 1 --batch 8 --generations 4 --max-completion-length 8)
  SHARD_ARGS=(--t 64)
else
  NPROC="${NPROC:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)}"
  [ "${NPROC:-0}" -ge 1 ] 2>/dev/null || NPROC=1
  REPLAY_ARGS=(--kernels fused)
  TRAIN_ARGS=(--steps 4 --warmup 1 --repeats 1 --batch 8 --generations 4 --max-completion-length 32)
  SHARD_ARGS=(--t 512)
fi

step() {  # step NAME LIMIT_SECONDS COMMAND...
  local name="$1" limit="$2"; shift 2
  local log="$OUT/$(echo "$name" | tr ' ' '_').log" t0 rc
  echo "gpu_check: $name ..." >&2
  t0=$(date +%s)
  timeout "$limit" "$@" > "$log" 2>&1
  rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" "$log" >> "$OUT/status.tsv"
}

step "bench replay" 120 "$PY" -m mrtpo.cli.main bench replay --device "$DEVICE" --config "$CONFIG" \
  ${REPLAY_ARGS[@]+"${REPLAY_ARGS[@]}"} --json "$OUT/replay.json"
step "bench train" 120 "$PY" -m mrtpo.cli.main bench train --device "$DEVICE" --config "$CONFIG" \
  ${TRAIN_ARGS[@]+"${TRAIN_ARGS[@]}"} --output "$OUT/train.json"
step "sharded replay" 60 "$PY" -m torch.distributed.run --standalone --nproc_per_node "$NPROC" \
  -m mrtpo.bench.sharded --device "$DEVICE" --config "$CONFIG" ${SHARD_ARGS[@]+"${SHARD_ARGS[@]}"} --json "$OUT/sharded.json"
# --- distance kernels (eager vs fused) at the config's shapes: V = 152,064, H = 3,584 for qwen2.5-7b ---
if [ "$DEVICE" = cpu ]; then KERNEL_ARGS=(--t 128); else KERNEL_ARGS=(); fi
step "distance kernels" 60 "$PY" -m mrtpo.bench.kernels --device "$DEVICE" --config "$CONFIG" \
  ${KERNEL_ARGS[@]+"${KERNEL_ARGS[@]}"} --json "$OUT/kernels.json"
# --- end of the distance-kernels step ---
step "matrix" 120 "$PY" -m mrtpo.integrations.trl.matrix --device "$DEVICE" --nproc "$NPROC" --out "$OUT/matrix" \
  --cells single/bf16/full/reward single/bf16/lora/reward single/bf16/full/cort single/bf16/full/opsd \
  zero3/bf16/lora/reward --json "$OUT/matrix.json"
"$PY" -m mrtpo.bench.gpu_table "$OUT"
