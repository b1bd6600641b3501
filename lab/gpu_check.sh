#!/usr/bin/env bash
# The GPU machine's check, in one command: the GPU test tier, then the GPU measurements the docs list as owed.
#
# usage: bash lab/gpu_check.sh [part ...]      parts: tier peak steps warm minute fast best
#        (default: tier peak warm minute)
#   tier    pytest -m cuda tests/e2e/test_cuda.py (the device paths behind the GPU figures; docs/BENCHMARKS.md)
#   peak    lab/bench_matmul.py: the measured bf16 matmul peak that MFU figures divide by
#   steps   docs/BENCHMARKS.md's model-step table, ours against timm (and the official T2T-ViT code where
#           VIT_T2T_OFFICIAL names it): lab/benchmark.py compile=both vs_timm=true, one record per model
#           ($STEP_MODELS, default "vit_tiny_cifar vit_tiny vit_small vit_base"; $T2T_MODELS, default
#           "t2t_vit_t_14 t2t_vit_14 t2t_vit_7", eager with memory=true, then compiled)
#   warm    one short cifar10_minute run that fills the decoded-image cache and the minute model's compile cache,
#           so the budgeted runs after it start warm (its own time is not a result)
#   minute  experiment=cifar10_minute (its trainer.budget, 60 s), for each seed in $SEEDS (default "0 1 2")
#   fast    experiment=cifar10_fast (5 minutes), for each seed in $FAST_SEEDS (default "0")
#   best    experiment=cifar10_best (8 minutes), for each seed in $BEST_SEEDS (default "0"): a call of its own
# Environment: CIFAR10 (the CIFAR-10 JPEG archive or folder; default .device/cifar10-jpeg.tar.gz, extracted to
# .device/cifar10), OUT (where records go; default outputs/gpu_check), VIT_COMMIT (the commit, where no .git is),
# TRAIN_ARGS (overrides added to every run, e.g. `data.batch_size=32` for a dry run of the script on a CPU),
# DEADLINE_S (seconds from the start after which no command is begun and a running one is stopped; default 560,
# inside the device tool's 10 minutes, so that the records of what finished still come back).
# Writes $OUT/records.tgz (every run's metrics.json, config and log; the tier's junit XML; the matmul record) and
# $OUT/summary.txt, printed last. Sized for one call of under 10 minutes with the default parts: 274 s on an H200
# (2026-11-26); `tier fast` took 369 s there on a fresh machine. The three recipes need two calls: `warm minute
# fast` (about 8.5 minutes: 3 x 60 s and 5 minutes, with start-ups) and `best` (about 9).
set -uo pipefail
case "${1:-}" in -h|--help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
cd "$(dirname "$0")/.."
parts=("$@"); [ ${#parts[@]} -eq 0 ] && parts=(tier peak warm minute)
OUT=${OUT:-outputs/gpu_check}; mkdir -p "$OUT"
runs=$(mktemp -d /tmp/gpu_check.XXXX)
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
deadline=$((SECONDS + ${DEADLINE_S:-560}))
left() { echo $((deadline - SECONDS)); }  # seconds until the deadline
bounded() {  # bounded <command...>: run it, stopped at the deadline; skipped once the deadline has passed
    if [ "$(left)" -le 5 ]; then echo "skipped (deadline): $*" >>"$runs/summary.txt"; return 124; fi
    timeout -s TERM "$(left)" "$@"
}

# A GPU machine without a network: the wheels of what its Python lacks (hydra-core, omegaconf, antlr4-python3-runtime)
# and the CIFAR-10 archive are put into .device/ beforehand, and installed and extracted here.
if ls .device/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --target .device/site .device/*.whl || exit 1
    export PYTHONPATH=$PWD/.device/site:$PWD
fi
data=${CIFAR10:-.device/cifar10-jpeg.tar.gz}
[ -d .device/t2t-vit/models ] && export VIT_T2T_OFFICIAL=${VIT_T2T_OFFICIAL:-$PWD/.device/t2t-vit}
if [ -f "$data" ]; then
    tar xzf "$data" -C "$(dirname "$data")" && data=$(dirname "$data")/cifar10
fi
commit=${VIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
short=${commit:0:7}  # the records are named for it, as docs/results/ keeps them
{
    echo "commit $commit; date $(date -u +%FT%TZ)"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
    $PY -c 'import torch, timm; print("torch", torch.__version__, "timm", timm.__version__, "cuda", torch.cuda.is_available())'
} | tee "$runs/machine.txt"

train() {  # train <name> <overrides...>: one run in its own folder; its last lines go to the summary
    local name=$1; shift
    bounded $PY train.py data=imagefolder data.root="$data" "$@" ${TRAIN_ARGS:-} hydra.run.dir="$runs/$name" >"$runs/$name.log" 2>&1
    echo "$name: rc $? $(grep -E '^budget|test top-1|final' "$runs/$name.log" | tail -3 | tr '\n' ' ')" >>"$runs/summary.txt"
}

for part in "${parts[@]}"; do
    case $part in
        tier) bounded $PY -m pytest -q -m cuda tests/e2e/test_cuda.py -rs --junitxml="$runs/cuda_tier_$short.xml" 2>&1 | tail -25 | tee "$runs/tier.txt"
              echo "tier: $(tail -1 "$runs/tier.txt")" >>"$runs/summary.txt" ;;
        peak) bounded $PY lab/bench_matmul.py n=8192 dtype=bf16 rounds=10 json="$runs/matmul_bf16_$short.json" >>"$runs/summary.txt" ;;
        steps) for model in ${STEP_MODELS:-vit_tiny_cifar vit_tiny vit_small vit_base}; do
                   bounded $PY lab/benchmark.py models="$model" compile=both vs_timm=true \
                       json="$runs/step_$model.json" >"$runs/step_$model.log" 2>&1
                   echo "steps $model: rc $? $(grep -E '^\| ' "$runs/step_$model.log" | tail -2 | tr '\n' ' ')" >>"$runs/summary.txt"
               done
               if [ -n "${VIT_T2T_OFFICIAL:-}" ]; then
                   for model in ${T2T_MODELS:-t2t_vit_t_14 t2t_vit_14 t2t_vit_7}; do
                       for mode in "off memory=true" on; do
                           tag=${mode%% *}
                           bounded $PY lab/benchmark.py models="$model" compile=$mode vs_timm=true \
                               json="$runs/step_${model}_compile_$tag.json" >"$runs/step_${model}_$tag.log" 2>&1
                           echo "steps $model compile=$tag: rc $? $(grep -E '^\| ' "$runs/step_${model}_$tag.log" | tail -1)" >>"$runs/summary.txt"
                       done
                   done
               fi ;;
        warm) train warm experiment=cifar10_minute trainer.budget=null trainer.epochs=1 trainer.limit_train_batches=10 trainer.save_checkpoints=false ;;
        minute) for seed in ${SEEDS:-0 1 2}; do
                    train "cifar10_minute_60s_seed$seed" experiment=cifar10_minute trainer.seed="$seed"
                done ;;
        fast) for seed in ${FAST_SEEDS:-0}; do
                  train "cifar10_fast_5m_seed$seed" experiment=cifar10_fast trainer.seed="$seed"
              done ;;
        best) for seed in ${BEST_SEEDS:-0}; do
                  train "cifar10_best_8m_seed$seed" experiment=cifar10_best trainer.seed="$seed"
              done ;;
        *) echo "unknown part: $part (parts: tier peak steps warm minute fast best)" >&2; exit 2 ;;
    esac
done
cp "$runs/machine.txt" "$OUT/machine.txt"; cp "$runs/machine.txt" "$runs/machine_$short.txt"
tar czf "$OUT/records.tgz" -C "$runs" --exclude='*.pt' --exclude='events.out.*' --exclude='*.npy' .
cat "$runs/machine.txt" "$runs/summary.txt" | tee "$OUT/summary.txt"
