#!/usr/bin/env bash
# Training speed of diffmem's loop under speed switches, against benchmarks/reference_train.py, alternating
# every variant in each round so that machine drift hits all of them. Prints one line per run and run variant, then
# the median images/s of each variant and its ratio to the reference at the same thread count.
# Usage (from the project root): [VARIANTS="..."] benchmarks/train_variants.sh [WIDTH] [IMAGE_SIZE] [BATCH] [STEPS] [ROUNDS]
set -euo pipefail
w=${1:-8} s=${2:-16} b=${3:-32} k=${4:-30} rounds=${5:-3}
py=${PYTHON:-python3}
ref=${REFERENCE:-$(cd "$(dirname "$0")" && pwd)/reference_train.py}
args=(--width "$w" --image-size "$s" --batch "$b" --steps "$k")
declare -A cmds=(
  [reference]="$py $ref ${args[*]}"
  [reference_t1]="$py $ref ${args[*]} --threads 1"
  [diffmem]="diffmem bench train ${args[*]} --device cpu"
  [diffmem_fused]="diffmem bench train ${args[*]} --device cpu --adam-impl fused"
  [diffmem_t1]="diffmem bench train ${args[*]} --device cpu --threads 1"
  [diffmem_t1_fused]="diffmem bench train ${args[*]} --device cpu --threads 1 --adam-impl fused"
  [diffmem_t1_channels_last]="diffmem bench train ${args[*]} --device cpu --threads 1 --channels-last"
  [diffmem_t1_bf16]="diffmem bench train ${args[*]} --device cpu --threads 1 --precision bf16"
)
# VARIANTS="reference_t1 diffmem_t1 ..." picks a subset (default: all, in this order)
read -r -a order <<< "${VARIANTS:-reference diffmem diffmem_fused reference_t1 diffmem_t1 diffmem_t1_fused diffmem_t1_channels_last diffmem_t1_bf16}"
results=$(mktemp)
trap 'rm -f "$results"' EXIT
for r in $(seq "$rounds"); do
  for name in "${order[@]}"; do
    line=$(${cmds[$name]} | tail -n 1)
    echo "round $r $name $line"
    echo "$name $line" >> "$results"
  done
done
"$py" - "$results" <<'PY'
import collections, json, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    name, text = line.split(" ", 1)
    runs[name].append(json.loads(text)["images_per_s"])
med = {name: statistics.median(v) for name, v in runs.items()}
for name, m in med.items():
    base = med["reference_t1" if "t1" in name else "reference"]
    print(f"{name:18s} median images/s {m:9.1f}  ratio to reference at the same threads {m / base:.2f}  "
          f"(runs: {', '.join(f'{x:.1f}' for x in runs[name])})")
PY
