#!/usr/bin/env bash
# Issue 32: Nsight Compute over FrdHead's WGMMA launches at B = 65536 (profile.py's run),
# with per-instruction stall samples: where a row product's warps wait. Output in $1.
#   source .gpu/env.sh && bash probes/frdhead_wgmma/ncu_rows.sh $OUT
set -uo pipefail
out=${1:?usage: ncu_rows.sh OUT}
mkdir -p "$out/ncu"
kernels='regex:frdhead_(wg|f16)_(hidden|forward_loss|dhidden|grad_h_t|grad_w2|grad_w1|rows|grad_w1_dpre)$'
ncu --clock-control none -k "$kernels" -c 9 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats --section SourceCounters \
    --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed,sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_elapsed,sm__inst_executed_pipe_tensor_op_gmma.sum \
    -o "$out/ncu/rows" python probes/frdhead_wgmma/profile.py > "$out/ncu/ncu.log" 2>&1
echo "rc=$?" >> "$out/ncu/ncu.log"
ncu -i "$out/ncu/rows.ncu-rep" --page details --csv > "$out/ncu/details.csv" 2>> "$out/ncu/ncu.log"
for k in f16_forward_loss wg_hidden wg_forward_loss wg_dhidden wg_grad_h_t wg_grad_w2 wg_grad_w1 \
         f16_rows wg_grad_w1_dpre; do
    ncu -i "$out/ncu/rows.ncu-rep" -k "frdhead_$k" --page source --csv --print-source sass \
        > "$out/ncu/source_$k.csv" 2>> "$out/ncu/ncu.log"
done
rm -f "$out/ncu/rows.ncu-rep"
(cd "$out" && tar czf ncu.tgz ncu && rm -rf ncu)
