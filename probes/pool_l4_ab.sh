#!/usr/bin/env bash
# Issue 34: time pending LAYOUT 4 patch sets against each other in one GPU call, before any of
# them is validated. Each argument is a set: folders of probes/pending, applied in order with
# `patch -p1` on the tree as committed. With a set applied, gpu_round.sh's tune step re-tunes
# both H=32 passes over every LAYOUT 4 launch (probes/pool_l4_tries.py tried first) into
# $OUT/set<N>/tune.tgz; the tuned table it exported is put back and the set taken off before
# the next one.
# An empty set ("") is the tree as committed (where its tuning caches are current, the tune
# replays them and times nothing anew).
#   source .gpu/env.sh && bash probes/pool_l4_ab.sh $OUT "patch-a" "patch-a patch-b"
# (at 45ae44d it timed l4-softmax-ilp against l4-softmax-ilp + l4-warp-fetch: probes/pool_wide/NOTES.md)
# DRY=1 applies and takes back each set without tuning (a check of the patches, no GPU); a set
# that does not apply is noted in its folder's error.txt and left out;
# QUICK=1 times each set at the shipped launches instead, untuned (probes/pool_l4_quick_ab.py,
# a line a set into $OUT/quick_ab.txt, a few seconds a set; $SHAPE=H,D,B,K another shape's);
# POINTS='forward={"GRID":3} backward={"MIN_BLOCKS":2}' times each set at those changes of the
# shipped launches (probes/pool_layout5.py --points, into $OUT/set<N>/points.json).
set -uo pipefail
out=${1:?usage: pool_l4_ab.sh OUT SET...}; shift
table=pycuda_heads/tuned/nvidia-h200.json
h32="B=512,K=64:N_HORIZONS=32,HIDDEN_DIM=128"
n=0
for set in "$@"; do
    n=$((n + 1)); dir="$out/set$n"; mkdir -p "$dir"; echo "$set" > "$dir/set.txt"
    files=()
    for name in $set; do files+=(probes/pending/"$name"/*.patch); done
    applied=()  # a set that does not apply is taken back and left out; the next set still runs
    for f in "${files[@]}"; do
        if ! patch -s -p1 --dry-run < "$f" > /dev/null; then
            echo "does not apply: $f" > "$dir/error.txt"; break
        fi
        patch -s -p1 --no-backup-if-mismatch < "$f"; applied+=("$f")
    done
    if [[ -f $dir/error.txt ]]; then
        :  # left out: nothing to time
    elif [[ -n ${QUICK:-} ]]; then
        timeout 60 python probes/pool_l4_quick_ab.py "$set" ${SHAPE:+"$SHAPE"} >> "$out/quick_ab.txt" 2>&1
    elif [[ -n ${POINTS:-} ]]; then
        # shellcheck disable=SC2086  # POINTS: words on purpose (ROLE=JSON each, no spaces)
        timeout "${POINTS_S:-120}" python probes/pool_layout5.py "$dir/points.json" \
            --shapes "${SHAPE:-32,128,512,64}" --points $POINTS > "$dir/points.log" 2>&1
    elif [[ -z ${DRY:-} ]]; then
        cp "$table" "$dir/table.before.json"
        STEPS=tune TUNE_TASKS="pool.forward:$h32 pool.backward:$h32" \
            TUNE_TRY="$(python probes/pool_l4_tries.py)" TUNE_TRIALS=34 TUNE_S=100 \
            bash probes/gpu_round.sh "$dir" "pending:${set// /+}"
        mv "$dir/table.before.json" "$table"
    fi
    for ((i = ${#applied[@]} - 1; i >= 0; i--)); do
        patch -s -R -p1 --no-backup-if-mismatch < "${applied[i]}"
    done
done
