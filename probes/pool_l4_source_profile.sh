#!/usr/bin/env bash
# Issue 34: where LAYOUT 4's tuned H=32 launches stall, instruction by instruction. Nsight
# Compute's full set over the forward and the backward once each (probes/pool_profile.py at
# H=32, D=128, B=512, K=64), its source view as SASS with each instruction's executions and
# stall samples, and the sections' details; into $1/srcprof.tgz. $SHAPE (H,D,B,K) profiles
# another shape's tuned launches the same way (8,512,1024,128: LAYOUT 5 at the wide head).
#   source .gpu/env.sh && bash probes/pool_l4_source_profile.sh $OUT
set -uo pipefail
out=${1:?usage: pool_l4_source_profile.sh OUT}
root=$PWD
mkdir -p "$out/srcprof" && cd "$out/srcprof" || exit 1
timeout "${SRC_S:-150}" ncu --clock-control none --set full -k regex:"pool_(forward|backward)" \
    -c 2 -o l4 python "$root/probes/pool_profile.py" "${SHAPE:-32,128,512,64}" > ncu.log 2>&1
echo "rc=$? (profile)" >> ncu.log
ncu -i l4.ncu-rep --page source --csv --print-source sass > source.csv 2>> ncu.log
echo "rc=$? (source)" >> ncu.log
ncu -i l4.ncu-rep --page details --csv > details.csv 2>> ncu.log
gzip -f source.csv l4.ncu-rep
cd "$out" && tar czf srcprof.tgz srcprof && rm -rf srcprof
