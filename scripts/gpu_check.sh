#!/usr/bin/env bash
# The checks only a GPU can run, in one go, ending with one table (and the same table as markdown for
# docs/scale.md, with the commit it ran on). Every step has a time limit; on CUDA they add up to 12 minutes
# (90 + 150 + 140 + 60 + 80 + 45 + 115 + 25 + 15 s). A step that fails or runs out of time is a row saying so.
#   wheels             (with --wheels) the wheels of scripts/gpu_wheels.sh into /tmp/site
#   train full         mrtpo bench train: per-step time and peak memory of TRL GDPO, mrtpo GDPO and MRTPO at
#                      Qwen2.5-1.5B-Instruct's shapes (random weights, bf16, TRL's bf16 autocast and gradient
#                      checkpointing, as the recipes train), and replay's share of the MRTPO step
#   train slice        the same at Qwen2.5-7B's width and vocabulary with 4 of its 28 layers
#   distance kernels   eager vs fused (Triton on CUDA) JS distances at V = 152,064, H = 3,584 (Qwen2.5-7B),
#                      float32 and bfloat16 projection: time and peak memory
#   bench replay       naive float32 vs mrtpo replay at Qwen2.5-7B shapes, float64 reference, projection dtypes
#   sharded replay     FSDP2 replay (gather and lockstep) vs an unsharded copy; one process per GPU, NCCL
#   matrix             the trainer with TRL's bf16 autocast, LoRA, CoRT, OPSD, and under ZeRO-3 with one
#                      process per GPU, each cell's replay checked against float32 (mrtpo matrix)
#   plan               mrtpo plan's prediction for each measurement (python -m mrtpo.bench.gpu_plan)
#   table              python -m mrtpo.bench.gpu_table: OUT/table.txt and OUT/table.md
#
#   scripts/gpu_check.sh                                 # cuda, the shapes above
#   scripts/gpu_wheels.sh && scripts/gpu_check.sh --wheels .whl   # a GPU image without TRL, datasets, DeepSpeed
#   scripts/gpu_check.sh --device cpu --config tiny      # every step on CPU at the tiny config's shapes
#
# Options: --device cuda|cpu, --config paper|tiny (default paper on cuda; tiny: a 2-layer model of V = 32,768,
# H = 128 for every step, its slice 1 layer), --out DIR (default: a new temp dir), --nproc N (processes of
# the sharded and matrix steps; default: the GPUs nvidia-smi lists, 2 on CPU), --limit-scale X (every limit
# times X; default 1 on cuda, 4 on cpu, whose cores may be shared), --commit SHA (default: git's HEAD, with
# "+dirty" for uncommitted changes). PYTHON selects the interpreter (default: python). Each step's log and
# JSON stay in the output directory.
#
# On a machine with torch but without the project's install (a GPU image: torch, transformers, accelerate
# and peft, no trl, datasets or deepspeed, no package index), run from the repository root: src/ is put on
# PYTHONPATH. The distance-kernels, bench-replay and sharded steps need torch and transformers only; the
# train and matrix steps need the wheels scripts/gpu_wheels.sh prepares on a machine with an index (.whl/,
# installed with --no-deps into /tmp/site by --wheels .whl). The project's version pins are not enforced
# there (nothing is pip-installed from pyproject.toml): that image's transformers 5.17 is the `train` extra's
# floor (>=5.17), and its torch 2.11 lies inside the declared range.
set -u
DEVICE=cuda
CONFIG=""
OUT=""
NPROC=""
WHEELS=""
SCALE=""
COMMIT=""
ARGS="$*"
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE="$2"; shift 2 ;;
    --config) CONFIG="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --nproc) NPROC="$2"; shift 2 ;;
    --wheels) WHEELS="$2"; shift 2 ;;
    --limit-scale) SCALE="$2"; shift 2 ;;
    --commit) COMMIT="$2"; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
case "$DEVICE" in cuda|cpu) ;; *) echo "gpu_check.sh: --device must be cuda or cpu, got $DEVICE" >&2; exit 2 ;; esac
CONFIG="${CONFIG:-$([ "$DEVICE" = cpu ] && echo tiny || echo paper)}"
case "$CONFIG" in paper|tiny) ;; *) echo "gpu_check.sh: --config must be paper or tiny, got $CONFIG" >&2; exit 2 ;; esac
SCALE="${SCALE:-$([ "$DEVICE" = cpu ] && echo 4 || echo 1)}"
awk -v s="$SCALE" 'BEGIN { exit !(s > 0) }' || { echo "gpu_check.sh: --limit-scale must be > 0, got $SCALE" >&2; exit 2; }
PY="${PYTHON:-python}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
OUT="${OUT:-$(mktemp -d -t mrtpo-gpu-check-XXXXXX)}"
if [ -z "$COMMIT" ]; then
  COMMIT=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
  [ "$COMMIT" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] && COMMIT="$COMMIT+dirty"
fi
mkdir -p "$OUT"
: > "$OUT/status.tsv"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

step() {  # step NAME LIMIT_SECONDS COMMAND...
  local name="$1" limit t0 rc log
  limit=$(awk -v l="$2" -v s="$SCALE" 'BEGIN { printf "%d", l * s + 0.5 }'); shift 2
  log="$OUT/$(echo "$name" | tr ' ' '_').log"
  echo "gpu_check: $name (limit $limit s) ..." >&2
  t0=$(date +%s)
  timeout "$limit" "$@" > "$log" 2>&1
  rc=$?
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" "$log" "$limit" >> "$OUT/status.tsv"
}

if [ -n "$WHEELS" ]; then  # wheels of scripts/gpu_wheels.sh (and DeepSpeed's source, built here)
  install_wheels() {
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      "$WHEELS"/*.whl || return 1
    for sdist in "$WHEELS"/*.tar.gz; do
      [ -e "$sdist" ] || continue
      PYTHONPATH=/tmp/site DS_BUILD_OPS=0 "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site \
        "$sdist" || echo "gpu_check: building $sdist failed (its steps will say so)" >&2
    done
  }
  export -f install_wheels; export PY WHEELS
  step "wheels" 90 bash -c install_wheels  # DeepSpeed's source builds in ~60 s on 2 busy cores
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
[ -d src/mrtpo ] && export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

if [ "$DEVICE" = cpu ]; then
  export ACCELERATE_USE_CPU=true OMP_NUM_THREADS=1
  NPROC="${NPROC:-2}"
  TRAIN_ARGS=(--steps 3 --warmup 1 --repeats 1 --batch 8 --generations 4 --max-completion-length 8)
  REPLAY_ARGS=(--t 128 --threads 2 --kernels fused)
  KERNEL_ARGS=(--t 128)
  SHARD_ARGS=(--t 64)
else
  NPROC="${NPROC:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)}"
  [ "${NPROC:-0}" -ge 1 ] 2>/dev/null || NPROC=1
  TRAIN_ARGS=(--steps 4 --warmup 1 --repeats 1 --batch 8 --generations 4 --max-completion-length 128)
  REPLAY_ARGS=(--kernels fused)
  KERNEL_ARGS=()
  SHARD_ARGS=(--t 512)
fi
if [ "$CONFIG" = tiny ]; then
  FULL=(--config tiny); SLICE=(--config tiny --layers 1); WIDE=tiny
  FULL_LABEL="tiny (2 layers)"; SLICE_LABEL="tiny slice (1 layer)"
else
  FULL=(--config qwen2.5-1.5b-instruct); SLICE=(--config qwen2.5-7b --layers 4); WIDE=qwen2.5-7b
  FULL_LABEL="1.5B"; SLICE_LABEL="7B slice (4 of 28 layers)"
fi
TRAIN_ARGS+=(--device "$DEVICE" --bf16 --gradient-checkpointing)

echo "$FULL_LABEL" > "$OUT/train_full.label"
step "train full" 150 "$PY" -m mrtpo.cli.main bench train "${FULL[@]}" "${TRAIN_ARGS[@]}" --output "$OUT/train_full.json"
echo "$SLICE_LABEL" > "$OUT/train_slice.label"
step "train slice" 140 "$PY" -m mrtpo.cli.main bench train "${SLICE[@]}" "${TRAIN_ARGS[@]}" \
  --output "$OUT/train_slice.json"
# --- distance kernels (eager vs fused) at the wide config's V and H: V = 152,064, H = 3,584 for qwen2.5-7b ---
step "distance kernels" 60 "$PY" -m mrtpo.bench.kernels --device "$DEVICE" --config "$WIDE" \
  ${KERNEL_ARGS[@]+"${KERNEL_ARGS[@]}"} --json "$OUT/kernels.json"
step "bench replay" 80 "$PY" -m mrtpo.cli.main bench replay --device "$DEVICE" --config "$WIDE" \
  ${REPLAY_ARGS[@]+"${REPLAY_ARGS[@]}"} --json "$OUT/replay.json"
step "sharded replay" 45 "$PY" -m torch.distributed.run --standalone --nproc_per_node "$NPROC" \
  -m mrtpo.bench.sharded --device "$DEVICE" --config "$WIDE" ${SHARD_ARGS[@]+"${SHARD_ARGS[@]}"} --json "$OUT/sharded.json"
step "matrix" 115 "$PY" -m mrtpo.integrations.trl.matrix --device "$DEVICE" --nproc "$NPROC" --out "$OUT/matrix" \
  --cells single/bf16/full/reward single/bf16/lora/reward single/bf16/full/cort single/bf16/full/opsd \
  zero3/bf16/lora/reward --json "$OUT/matrix.json"
GPU_NAME=cpu  # the GPU as mrtpo plan names it (its stated throughput and memory)
if [ "$DEVICE" = cuda ]; then
  case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
    *H200*) GPU_NAME=h200 ;; *H100*) GPU_NAME=h100 ;; *A100*) GPU_NAME=a100 ;; *) GPU_NAME=h200 ;;
  esac
fi
step "plan" 25 "$PY" -m mrtpo.bench.gpu_plan "$OUT" --gpu "$GPU_NAME"
timeout "$(awk -v s="$SCALE" 'BEGIN { printf "%d", 15 * s + 0.5 }')" "$PY" -m mrtpo.bench.gpu_table "$OUT" \
  --markdown "$OUT/table.md" --commit "$COMMIT" --command "scripts/gpu_check.sh $ARGS" | tee "$OUT/table.txt"
echo "gpu_check: the table is $OUT/table.txt; as markdown (for docs/scale.md) $OUT/table.md" >&2
