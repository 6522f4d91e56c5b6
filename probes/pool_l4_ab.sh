#!/usr/bin/env bash
# Issue 34: time pending LAYOUT 4 patch sets against each other in one GPU call, before any of
# them is validated. Each argument is a set: folders of probes/pending, applied in order with
# `patch -p1` on the tree as committed. A set is applied, both H=32 passes are re-tuned over
# every LAYOUT 4 launch (probes/pool_l4_tries.py tried first; `tune` alone, no export), its
# tune log and caches go to $OUT/set<N>/, and the set is taken back off before the next one.
#   source .gpu/env.sh && bash probes/pool_l4_ab.sh $OUT "l4-softmax-ilp" \
#       "l4-softmax-ilp l4-warp-fetch"
# DRY=1 applies and takes back each set without tuning (a check of the patches, no GPU).
set -uo pipefail
out=${1:?usage: pool_l4_ab.sh OUT SET...}; shift
caches=reports/nvidia-h200/tuning
tasks=("pool.forward" "pool.backward")
n=0
for set in "$@"; do
    n=$((n + 1)); dir="$out/set$n"; mkdir -p "$dir"; echo "$set" > "$dir/set.txt"
    files=()
    for name in $set; do files+=(probes/pending/"$name"/*.patch); done
    for f in "${files[@]}"; do patch -s -p1 < "$f" || { echo "does not apply: $f" >> "$dir/tune.log"; exit 1; }; done
    if [[ -z ${DRY:-} ]]; then
        for kernel in "${tasks[@]}"; do
            tries=()
            for p in $(python probes/pool_l4_tries.py); do
                [[ $p == "$kernel="* ]] && tries+=(--try "${p#*=}")
            done
            timeout 160 pycuda-heads tune --kernel "$kernel" --shape B=512,K=64 \
                --template N_HORIZONS=32,HIDDEN_DIM=128 --trials 34 --time-budget 100 \
                "${tries[@]}" --no-progress >> "$dir/tune.log" 2>&1
            echo "rc=$? ($kernel)" >> "$dir/tune.log"
            cp "$caches/$kernel"__HIDDEN_DIM=128,N_HORIZONS=32__B=512,K=64.json "$dir/$kernel.json"
        done
    fi
    for ((i = ${#files[@]} - 1; i >= 0; i--)); do patch -s -R -p1 < "${files[i]}"; done
done
