#!/usr/bin/env bash
# One GPU round at commit $2, results tarred into $1/round.tgz (the device returns few files):
# the host-cost A/B against .base (quiet machine first), then the GPU tests with their record
# beside a fresh sanitizer validation of every family, then the torch host-cost probe.
#   source .gpu/env.sh && bash probes/gpu_round.sh $OUT <commit>
set -uo pipefail
out=${1:?usage: gpu_round.sh OUT COMMIT}; commit=${2:?usage: gpu_round.sh OUT COMMIT}
r=$out/round; mkdir -p "$r"
ROUNDS=1 timeout 180 bash probes/ab_host_cost.sh "$r" > "$r/ab.log" 2>&1; echo "rc=$?" >> "$r/ab.log"
(timeout 330 python -m pytest -q -n 8 -m gpu tests/ --gpu-record -p no:cacheprovider \
    --timeout 300 --timeout-method thread > "$r/tests.log" 2>&1; echo "rc=$?" >> "$r/tests.log"
 cp reports/nvidia-h200/gpu_tests.json "$r/") &
(timeout 340 bash -c "pycuda-heads validate --sanitize --kernels pool --out $r/rep --commit $commit \
  && pycuda-heads validate --sanitize --kernels frdhead,resgate,residual,gate,frd,reduce,adam \
     --out $r/rep --commit $commit" > "$r/validate.log" 2>&1; echo "rc=$?" >> "$r/validate.log")
wait
timeout 40 python probes/torch_host_cost.py "$r/torch_host_cost.json" > "$r/probe.log" 2>&1
(cd "$out" && tar czf round.tgz round && rm -rf round)
