#!/usr/bin/env bash
# Each argument a set of probes/pending folders (applied in order, "" for the tree as it is):
# probes/pool_l4_quick_ab.py's line per set into $1/quick_ab.txt, the sets taken off after.
#   source .gpu/env.sh && bash probes/pool_l4_quick_ab.sh $OUT "" "l4-gn8"
set -uo pipefail
out=${1:?usage: pool_l4_quick_ab.sh OUT SET...}; shift
for set in "$@"; do
    files=()
    for name in $set; do files+=(probes/pending/"$name"/*.patch); done
    for f in "${files[@]}"; do patch -s -p1 < "$f" || exit 1; done
    timeout 60 python probes/pool_l4_quick_ab.py "$set" >> "$out/quick_ab.txt" 2>&1
    for ((i = ${#files[@]} - 1; i >= 0; i--)); do patch -s -R -p1 < "${files[i]}"; done
done
