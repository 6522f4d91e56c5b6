#!/usr/bin/env bash
# Host cost A/B on one GPU machine, one process after the other: the bench's host columns
# (python_call_us, bare_launch_us) of this tree against another commit's, at the quick shapes.
# Here:       git worktree add .base <commit> && ln -s ../tuning .base/pycuda_heads/tuning
#             (the base's tuner from its own checkout, not this tree's installed one; then name
#             .base in the device call's carry)
# On the GPU: source .gpu/env.sh && bash probes/ab_host_cost.sh $OUT
set -euo pipefail
out=${1:?usage: ab_host_cost.sh OUT_DIR}
ops=(${AB_OPS:-resgate pool step})  # the base takes them space-separated, this tree comma-separated
for round in $(seq 1 "${ROUNDS:-2}"); do  # alternated, so a drift of the machine shows in both
    # from inside .base: python -c puts the working folder first on the path
    (cd .base && python -c "import sys; from pycuda_heads.cli import main; sys.exit(main(sys.argv[1:]))" \
        bench --ops "${ops[@]}" --quick --out "$out/base$round" --commit base)
    pycuda-heads bench --ops "$(IFS=,; echo "${ops[*]}")" --quick --out "$out/head$round" \
        --commit head
done
(cd "$out" && tar czf ab_host_cost.tgz base[0-9]* head[0-9]*)
