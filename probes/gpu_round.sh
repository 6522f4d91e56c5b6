#!/usr/bin/env bash
# One GPU round at commit $2, results tarred into $1/round.tgz (the device returns few files):
# the host-cost A/B against .base on a quiet machine, the GPU tests with their record, the
# torch host-cost probe, then the torch_train bench rows (each shape's rows kept as measured).
#   source .gpu/env.sh && bash probes/gpu_round.sh $OUT <commit>
set -uo pipefail
out=${1:?usage: gpu_round.sh OUT COMMIT}; commit=${2:?usage: gpu_round.sh OUT COMMIT}
r=$out/round; mkdir -p "$r"
AB_OPS="resgate pool" ROUNDS=1 timeout 130 bash probes/ab_host_cost.sh "$r" > "$r/ab.log" 2>&1; echo "rc=$?" >> "$r/ab.log"
timeout 210 python -m pytest -q -rs -n 8 -m gpu tests/ --gpu-record -p no:cacheprovider \
    --timeout 200 --timeout-method thread > "$r/tests.log" 2>&1; echo "rc=$?" >> "$r/tests.log"
cp reports/nvidia-h200/gpu_tests.json "$r/"
timeout 40 python probes/torch_host_cost.py "$r/torch_host_cost.json" > "$r/probe.log" 2>&1
timeout "${TRAIN_S:-170}" pycuda-heads bench --ops torch_train --out "$r/bench" --commit "$commit" \
    > "$r/train.log" 2>&1; echo "rc=$?" >> "$r/train.log"
(cd "$out" && tar czf round.tgz round && rm -rf round)
