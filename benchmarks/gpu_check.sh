#!/usr/bin/env bash
# GPU check for issues #8 and #45, one short script for one GPU (estimated 5-8 minutes on one H100; not yet run on
# a GPU: no device was lent to the sessions that wrote it, see benchmarks/README.md).
# 1. speed (#8): training images/s and utilisation at 32x32, batch 512, W = 8 and 32 with attention: plain fp32, the
#    fast path (bf16 + channels-last), the fast path + torch.compile; DDIM-50 sampling images/s. One JSON line each.
# 2. reproducibility (#45, benchmarks/gpu_repro.py): a run killed (SIGTERM) and resumed against an uninterrupted one
#    (bit-identical with train.deterministic on), two runs with it off, a GPU state resumed on the CPU (its warning),
#    and the speed cost of determinism.
# Figures go to $OUT (set by the device runner; default: a new temporary folder): bench.jsonl and gpu_repro.json,
# and are printed.
# Check the script on a CPU (about a minute): bash benchmarks/gpu_check.sh --cpu-dry-run
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
dry=0
if [ "${1:-}" = "--cpu-dry-run" ]; then
    dry=1
    DEVICE=cpu BATCH=${BATCH:-8} STEPS=${STEPS:-2} WIDTHS=${WIDTHS:-8} COMPILE=${COMPILE:-0} SAMPLES=${SAMPLES:-8}
    SAMPLE_WIDTH=${SAMPLE_WIDTH:-8} SAMPLER_STEPS=${SAMPLER_STEPS:-3}
fi
device=${DEVICE:-cuda}
batch=${BATCH:-512}
steps=${STEPS:-30}
widths=${WIDTHS:-"8 32"}
compile=${COMPILE:-1}
samples=${SAMPLES:-2048}
sample_width=${SAMPLE_WIDTH:-32}
sampler_steps=${SAMPLER_STEPS:-50}
out=${OUT:-$(mktemp -d -t gpu_check.XXXXXX)}
mkdir -p "$out"
: > "$out/bench.jsonl"

bench() {
    python -c "import sys; from diffmem.cli import main; sys.exit(main(sys.argv[1:]))" bench "$@" | tail -n 1 \
        | tee -a "$out/bench.jsonl"
}
bench_train() {
    bench train --device "$device" --attention --image-size 32 --batch "$batch" --steps "$steps" "$@"
}
for w in $widths; do
    bench_train --width "$w" --warmup 5
    bench_train --width "$w" --warmup 5 --precision bf16 --channels-last
    if [ "$compile" = 1 ]; then
        bench_train --width "$w" --warmup 10 --precision bf16 --channels-last --compile
    fi
done
bench sample --device "$device" --attention --width "$sample_width" --image-size 32 --n-samples "$samples" \
    --sampler-steps "$sampler_steps" --batch-size 1024

if [ "$dry" = 1 ]; then
    python benchmarks/gpu_repro.py --cpu-dry-run --out "$out"
else
    python benchmarks/gpu_repro.py --out "$out"
fi
echo "figures in $out"
