#!/usr/bin/env bash
# The GPU round of the backward's key order (probes/pool_l2_order.py): the LAYOUT 2 entries
# (both roles: a module holds both entries, so the forward's variants changed too) re-tuned
# with the shipped LAYOUT 2 points tried first, the pool's GPU tests of the layouts and split
# rows, validation with compute-sanitizer and the pool's bench rows.
#   source .gpu/env.sh && bash probes/pool_l2_order_round.sh $OUT COMMIT
set -uo pipefail
t5="N_HORIZONS=5,HIDDEN_DIM=128"
tasks=""
for role in forward backward; do
    for shape in B=1024,K=128 B=4096,K=64 B=4096,K=256 B=64,K=4096; do
        tasks+=" pool.$role:$shape:$t5"
    done
    tasks+=" pool.$role:B=256,K=64:N_HORIZONS=2,HIDDEN_DIM=1024"
done
tries=$(python - <<'PY'
import json
table = json.load(open("pycuda_heads/tuned/nvidia-h200.json"))
points = {e["kernel"] + "=" + json.dumps(e["params"], separators=(",", ":"))
          for e in table["entries"]
          if e["kernel"].startswith("pool.") and e["params"].get("LAYOUT") == 2}
print(" ".join(sorted(points)))
PY
)
STEPS="tune tests validate train" TUNE_TASKS="$tasks" TUNE_TRY="$tries" TUNE_TRIALS=2 TUNE_S=30 \
    TESTS_K="layout_2 or with_and_without_ctx or split or programmatic or default_cannot or other_launch" \
    VALIDATE=pool VALIDATE_S=280 BENCH_OPS=pool TRAIN_S=120 \
    bash probes/gpu_round.sh "$1" "$2"
