#!/usr/bin/env bash
# GPU check for issue #8: training images/s and utilisation at 32x32, batch 512, for W = 8 and 32 (the paper's
# U-Net with attention): plain fp32, then the fast path (train.precision=bf16 + train.channels_last), then the fast
# path + torch.compile; and DDIM-50 sampling images/s. Each case prints one JSON line (diffmem bench's last line).
# Budget: under 5 minutes on one H200 (30 timed steps per case, compile warm-up included).
# Not run on a GPU yet: no device was lent to the sessions that wrote it (see benchmarks/README.md).
# Smoke test on a CPU: DEVICE=cpu BATCH=8 STEPS=2 WIDTHS=8 COMPILE=0 bash benchmarks/gpu_check.sh
set -euo pipefail
device=${DEVICE:-cuda}
batch=${BATCH:-512}
steps=${STEPS:-30}
widths=${WIDTHS:-"8 32"}
compile=${COMPILE:-1}
samples=${SAMPLES:-2048}

bench_train() {
    diffmem bench train --device "$device" --attention --image-size 32 --batch "$batch" --steps "$steps" "$@" | tail -n 1
}
for w in $widths; do
    bench_train --width "$w" --warmup 5
    bench_train --width "$w" --warmup 5 --precision bf16 --channels-last
    if [ "$compile" = 1 ]; then
        bench_train --width "$w" --warmup 10 --precision bf16 --channels-last --compile
    fi
done
diffmem bench sample --device "$device" --attention --width 32 --image-size 32 --n-samples "$samples" \
    --sampler-steps 50 --batch-size 1024 | tail -n 1
