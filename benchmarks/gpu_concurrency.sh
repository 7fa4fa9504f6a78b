#!/usr/bin/env bash
# Many small runs per GPU (issue #8): K copies of `diffmem bench train` started together on one GPU, for K in KS;
# prints one JSON line per K with the summed images/s (each copy times its own steps, which overlap because the
# copies start together and run the same number of steps) and the speed-up over K = 1.
# `diffmem sweep --cluster local --max-parallel K*G` already runs K jobs per GPU on G GPUs (each job goes to the
# least-loaded GPU); this script measures whether K > 1 helps for a given width before choosing K.
# Not run on a GPU yet. Smoke test on a CPU: DEVICE=cpu KS="1 2" BATCH=8 STEPS=3 bash benchmarks/gpu_concurrency.sh
set -euo pipefail
device=${DEVICE:-cuda}
width=${WIDTH:-8}
batch=${BATCH:-128}
steps=${STEPS:-200}
ks=${KS:-"1 2 4 8"}
py=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
base=""
for k in $ks; do
    pids=()
    for i in $(seq "$k"); do
        diffmem bench train --device "$device" --attention --width "$width" --image-size 32 --batch "$batch" \
            --steps "$steps" --warmup 10 > "$tmp/k${k}_$i.log" 2>&1 &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid"; done
    line=$("$py" - "$k" "$tmp" "$base" <<'PY'
import json, pathlib, sys
k, folder, base = int(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
runs = [json.loads(p.read_text().strip().splitlines()[-1]) for p in sorted(folder.glob(f"k{k}_*.log"))]
total = sum(r["images_per_s"] for r in runs)
out = {"k": k, "width": runs[0]["width"], "batch": runs[0]["batch"], "device": runs[0]["device"],
       "total_images_per_s": total, "per_run_images_per_s": [r["images_per_s"] for r in runs]}
if base:
    out["speedup_over_k1"] = total / float(base)
print(json.dumps(out))
PY
)
    echo "$line"
    if [ -z "$base" ]; then base=$("$py" -c 'import json,sys; print(json.loads(sys.argv[1])["total_images_per_s"])' "$line"); fi
done
