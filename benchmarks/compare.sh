#!/usr/bin/env bash
# diffmem's training speed against the plain reference loop (benchmarks/reference_train.py), both on the same U-Net.
#
# Every round runs `diffmem bench train` and then the reference with the same width, image size, batch and step count,
# so that a slow period of a shared machine falls on both sides of a round rather than on one of them. For each round
# it prints both JSON results and keeps the ratio of their images/s; the last line is the median ratio over rounds
# (> 1: diffmem is faster).
#
# Usage, from the repository root:
#   benchmarks/compare.sh [WIDTH] [IMAGE_SIZE] [BATCH] [STEPS] [ROUNDS]      (defaults: 8 16 32 30 3)
# Environment: PYTHON (the interpreter, default python3), THREADS (if set, --threads for both sides; by default each
# side uses torch's choice).
set -euo pipefail

width=${1:-8}
size=${2:-16}
batch=${3:-32}
steps=${4:-30}
rounds=${5:-3}
python=${PYTHON:-python3}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

shape=(--width "$width" --image-size "$size" --batch "$batch" --steps "$steps")
if [[ -n "${THREADS:-}" ]]; then
  shape+=(--threads "$THREADS")
fi

# images_per_s of the first JSON object divided by that of the second
ratio_of='import json, sys; a, b = (json.loads(x) for x in sys.argv[1:3]); print(a["images_per_s"] / b["images_per_s"])'
median_of='import statistics, sys; r = [float(x) for x in sys.argv[1:]]; print(f"speed ratio diffmem/reference (median of {len(r)}): {statistics.median(r):.2f}")'

ratios=()
for ((round = 1; round <= rounds; round++)); do
  ours=$(diffmem bench train "${shape[@]}" --device cpu | tail -n 1)
  theirs=$("$python" "$here/reference_train.py" "${shape[@]}" | tail -n 1)
  echo "round $round: diffmem $ours"
  echo "round $round: reference $theirs"
  ratios+=("$("$python" -c "$ratio_of" "$ours" "$theirs")")
done
"$python" -c "$median_of" "${ratios[@]}"
