#!/usr/bin/env bash
# One GPU round at commit $2. Each step tars its own folder into $1 as soon as it ends, so a
# round cut short by the device's time limit still brings back what finished (the device
# returns few files). Steps, in order, from $STEPS (default: all):
#   ab        host-cost A/B against .base, quiet machine first ($AB_ROUNDS, $AB_OPS)
#   abmin     the same A/B by probes/host_cost_min.py (fastest of many runs), $AB_ROUNDS times
#   sweep     `sweep` of $SWEEP_KERNELS ($SWEEP_TRIALS trials a study, $SWEEP_S seconds), its
#             best validated points exported into the package's table (what later steps run)
#   tune      (after probes/preflight.py: no tune that would empty a kernel from the table)
#             `tune` of each $TUNE_TASKS entry (KERNEL:SHAPE:TEMPLATE, space-separated; $TUNE_TRIALS
#             trials, $TUNE_S seconds each; $TUNE_TRY: space-separated JSON points tried first
#             where valid, KERNEL=JSON for one kernel's tasks only: `tune` refuses a point with a
#             knob its kernel lacks), the best validated points exported into the table
#   tests     the GPU tests with their record ($TESTS_K: only those pytest -k selects), beside
#   validate  a fresh validation with compute-sanitizer of every family
#   native    build the C++ launcher of pycuda_heads.torch once, before anything uses it
#   probe     the torch host-cost probe with the C++ launcher (and the Python one: probepy)
#   breakdown where a PyTorch training step's host time goes, eager and reduce-overhead, and
#             fused Adam's host time after each implementation's compiled backward
#   stepsan   TrainStep under compute-sanitizer's four tools (beside the tests)
#   splitsan  the pool's split-K path under compute-sanitizer's four tools (beside the tests)
#   whole     the smoke training, the train_step bench rows
#   train     bench rows of $BENCH_OPS (default torch_train)
#   wide      the wide-head tensor-core prototypes (probes/pool_wide/run.py; $WIDE_ARGS: the
#             versions, e.g. "rate rows dsplit", default all)
#   chain     where the pool's fwd+bwd time goes at B=1024, K=128 (probes/pool_chain.py), or at
#             $CHAIN_SHAPES (H,D,B,K, space-separated)
#   splitk    the pool's split-K rule and launches swept (probes/pool_splitk/virtual.py),
#             $SPLITK_S seconds ($SPLITK_ARGS=--rule-only: the op's own rule and launch alone)
#   wgmma     the FRD head's first layer on wgmma (probes/frdhead_wgmma/run.py)
#   engine    FrdHead's roles on WGMMA=1 against the shipped launches (probes/frdhead_wgmma/engine.py)
#   wgradf16  the FP16 weight-gradient prototype against the library's (probes/frdhead_wgmma/wgrad_f16.py)
#   bwdparts  FrdHead.backward's launches timed alone at several points (probes/frdhead_wgmma/bwd_parts.py)
#   profile   Nsight Compute over the launches of $PROFILE_PY (default probes/pool_profile.py:
#             the pool's tuned launches at the shapes short of the bars), one CSV; more
#             sections in $PROFILE_SECTIONS (e.g. "--section ComputeWorkloadAnalysis")
#   measure   `efficiency --measure $MEASURE_ARGS` (e.g. "--task pool.backward:B=4096,K=256
#             --samplers tpe-transfer --chain-trials 25") for what is left of $ROUND_S seconds
#             (default 540)
#   source .gpu/env.sh && STEPS="tests validate" bash probes/gpu_round.sh $OUT <commit>
# $VALIDATE lists the validation runs, space-separated, each a --kernels value (default: pool,
# then every other family; a family left out keeps its record), $VALIDATE_S seconds each;
# $VALIDATE_PROOF identity proofs (space-separated) whose unchanged variants keep their clean
# sanitizer results.
set -uo pipefail
out=${1:?usage: gpu_round.sh OUT COMMIT}; commit=${2:?usage: gpu_round.sh OUT COMMIT}
steps=" ${STEPS:-ab abmin tests validate stepsan probe whole train} "
export PYCUDA_HEADS_COMMIT=$commit
pack() { (cd "$out" && tar czf "$1.tgz" "$1" && rm -rf "$1"); }
has() { [[ $steps == *" $1 "* ]]; }
# compute-sanitizer's four tools over script $2, each tool's findings into step $1's log
sanitize_step() {
    mkdir -p "$out/$1"
    for tool in memcheck racecheck initcheck synccheck; do
        timeout "$3" compute-sanitizer --tool "$tool" --report-api-errors no --error-exitcode 86 \
            python "$2" >> "$out/$1/sanitize.log" 2>&1
        echo "rc=$? ($tool)" >> "$out/$1/sanitize.log"
    done
    pack "$1"
}
# probe script $3 in step $1's folder for at most $2 seconds, writing its JSON $4 there (more
# arguments go to the script), its output into the step's log
probe_step() {
    mkdir -p "$out/$1"
    timeout "$2" python "$3" "$out/$1/$4" "${@:5}" > "$out/$1/$1.log" 2>&1
    echo "rc=$?" >> "$out/$1/$1.log"
    pack "$1"
}
# the best validated points into the package's table (what later steps run); step $1's folder
# takes the caches and the table, its log $2 the export's output
export_into() {
    pycuda-heads export --install >> "$2" 2>&1; echo "rc=$? (export)" >> "$2"
    cp -r reports/nvidia-h200/tuning pycuda_heads/tuned/nvidia-h200.json "$out/$1/"
    pack "$1"
}

if has native; then
    mkdir -p "$out/native"
    ( time python -c "from pycuda_heads.torch.native import build; print(build())" ) \
        > "$out/native/build.log" 2>&1; echo "rc=$?" >> "$out/native/build.log"
    pack native
fi
if has sweep; then
    mkdir -p "$out/sweep"
    timeout $(( ${SWEEP_S:-200} + 60 )) pycuda-heads sweep --kernels "${SWEEP_KERNELS:?}" \
        --trials "${SWEEP_TRIALS:-20}" --time-budget "${SWEEP_S:-200}" --no-progress \
        > "$out/sweep/sweep.log" 2>&1; echo "rc=$?" >> "$out/sweep/sweep.log"
    export_into sweep "$out/sweep/sweep.log"
fi
if has tune && { mkdir -p "$out/tune"; ! python probes/preflight.py "${TUNE_TASKS:?}" \
                   > "$out/tune/preflight.log" 2>&1; }; then
    echo "tune skipped: probes/preflight.py refused" >> "$out/tune/preflight.log"
    pack tune
elif has tune; then
    for task in ${TUNE_TASKS:?}; do
        IFS=: read -r kernel shape template <<< "$task"
        tries=()
        for point in ${TUNE_TRY:-}; do
            case $point in
                "$kernel="*) tries+=(--try "${point#*=}") ;;
                "{"*) tries+=(--try "$point") ;;
            esac
        done
        timeout $(( ${TUNE_S:-60} + 60 )) pycuda-heads tune --kernel "$kernel" --shape "$shape" \
            ${template:+--template "$template"} --trials "${TUNE_TRIALS:-30}" \
            --time-budget "${TUNE_S:-60}" "${tries[@]}" --no-progress >> "$out/tune/tune.log" 2>&1
        echo "rc=$? ($task)" >> "$out/tune/tune.log"
    done
    export_into tune "$out/tune/tune.log"
fi
if has ab; then
    mkdir -p "$out/ab"
    AB_OPS="${AB_OPS:-resgate}" ROUNDS="${AB_ROUNDS:-4}" timeout "${AB_S:-120}" \
        bash probes/ab_host_cost.sh "$out/ab" > "$out/ab/ab.log" 2>&1; echo "rc=$?" >> "$out/ab/ab.log"
    pack ab
fi
if has abmin; then
    mkdir -p "$out/abmin"
    for round in $(seq 1 "${AB_ROUNDS:-4}"); do  # -c: the working folder first on the path
        (cd .base && timeout 60 python -c "import runpy; runpy.run_path('../probes/host_cost_min.py', run_name='__main__')" \
            > "$out/abmin/base$round.json" 2>> "$out/abmin/ab.log")
        timeout 60 python -c "import runpy; runpy.run_path('probes/host_cost_min.py', run_name='__main__')" \
            > "$out/abmin/head$round.json" 2>> "$out/abmin/ab.log"
    done
    pack abmin
fi
if has tests; then
    mkdir -p "$out/tests"
    (timeout 230 python -m pytest -q -rs -n 8 -m gpu tests/ --gpu-record -p no:cacheprovider ${TESTS_K:+-k "$TESTS_K"} \
        --timeout 220 --timeout-method thread > "$out/tests/tests.log" 2>&1
     echo "rc=$?" >> "$out/tests/tests.log"
     cp reports/nvidia-h200/gpu_tests.json "$out/tests/") &
fi
if has validate; then
    # from the repository's record: a variant proven or left unchanged keeps its clean
    # sanitizer results, and the families not run keep theirs
    mkdir -p "$out/validate/rep/nvidia-h200"
    cp reports/nvidia-h200/validation.json "$out/validate/rep/nvidia-h200/"
    proofs=()
    for proof in ${VALIDATE_PROOF:-}; do proofs+=(--proof "$proof"); done
    for kernels in ${VALIDATE:-pool frdhead,resgate,residual,gate,frd,reduce,adam multiadam,headloss}; do
        timeout "${VALIDATE_S:-230}" pycuda-heads validate --sanitize --out "$out/validate/rep" \
            --kernels "$kernels" --commit "$commit" "${proofs[@]}" \
            >> "$out/validate/validate.log" 2>&1
        echo "rc=$? ($kernels)" >> "$out/validate/validate.log"
    done
    pack validate
fi
has stepsan && sanitize_step stepsan probes/train_step_sanitize.py 120  # beside the tests too
has splitsan && sanitize_step splitsan probes/pool_split_sanitize.py 150
wait
has tests && pack tests
if has probe; then
    mkdir -p "$out/probe"
    timeout 120 python probes/torch_host_cost.py "$out/probe/torch_host_cost.json" > "$out/probe/probe.log" 2>&1
    if has probepy; then
        PYCUDA_HEADS_NATIVE=0 timeout 120 python probes/torch_host_cost.py \
            "$out/probe/torch_host_cost_python.json" >> "$out/probe/probe.log" 2>&1
    fi
    pack probe
fi
if has breakdown; then
    mkdir -p "$out/breakdown"
    timeout 240 python probes/torch_host_breakdown.py "$out/breakdown/torch_host_breakdown.json" \
        > "$out/breakdown/breakdown.log" 2>&1
    timeout 240 python probes/torch_ro_adam.py "$out/breakdown/torch_ro_adam.json" \
        >> "$out/breakdown/breakdown.log" 2>&1
    pack breakdown
fi
if has whole; then
    mkdir -p "$out/whole"
    timeout 150 pycuda-heads smoke --out "$out/whole/rep" > "$out/whole/smoke.log" 2>&1
    echo "rc=$?" >> "$out/whole/smoke.log"
    pack whole
    mkdir -p "$out/trainstep"
    timeout "${WHOLE_S:-240}" pycuda-heads bench --ops train_step --out "$out/trainstep/bench" \
        --commit "$commit" > "$out/trainstep/bench.log" 2>&1; echo "rc=$?" >> "$out/trainstep/bench.log"
    pack trainstep
fi
if has train; then
    mkdir -p "$out/train"
    timeout "${TRAIN_S:-110}" pycuda-heads bench --ops "${BENCH_OPS:-torch_train}" --out "$out/train/bench" \
        --commit "$commit" > "$out/train/train.log" 2>&1; echo "rc=$?" >> "$out/train/train.log"
    pack train
fi
# shellcheck disable=SC2086  # WIDE_ARGS: words on purpose (the versions to run); the JSON is
# named after them (pool_wide_rate_rows_dsplit.json), so a run of some keeps the full one
has wide && probe_step wide "${WIDE_S:-90}" probes/pool_wide/run.py \
    "pool_wide${WIDE_ARGS:+_${WIDE_ARGS// /_}}.json" ${WIDE_ARGS:-}
# shellcheck disable=SC2086  # CHAIN_SHAPES: words on purpose (one shape each)
has chain && probe_step chain "${CHAIN_S:-150}" probes/pool_chain.py pool_chain.json ${CHAIN_SHAPES:-}
# shellcheck disable=SC2086  # SPLITK_ARGS: words on purpose
has splitk && probe_step splitk "${SPLITK_S:-200}" probes/pool_splitk/virtual.py \
    pool_splitk_rules.json ${SPLITK_ARGS:-}
# shellcheck disable=SC2086  # WGMMA_ARGS: words on purpose (the variants to run)
has wgmma && probe_step wgmma "${WGMMA_S:-120}" probes/frdhead_wgmma/run.py frd_wgmma.json ${WGMMA_ARGS:-}
has engine && probe_step engine "${ENGINE_S:-150}" probes/frdhead_wgmma/engine.py frd_engine.json
has wgradf16 && probe_step wgradf16 "${WGRADF16_S:-150}" probes/frdhead_wgmma/wgrad_f16.py \
    frd_wgrad_f16.json
has bwdparts && probe_step bwdparts "${BWDPARTS_S:-120}" probes/frdhead_wgmma/bwd_parts.py \
    frd_bwd_parts.json
if has profile; then
    mkdir -p "$out/profile"
    # shellcheck disable=SC2086  # PROFILE_SECTIONS: words on purpose (more --section options)
    timeout "${PROFILE_S:-150}" ncu --clock-control none --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
        ${PROFILE_SECTIONS:-} --csv python "${PROFILE_PY:-probes/pool_profile.py}" > "$out/profile/profile.csv" \
        2> "$out/profile/ncu.log"
    echo "rc=$?" >> "$out/profile/ncu.log"
    pack profile
fi
if has measure; then  # the tuner's quality search, resumable: whatever time the round has left
    mkdir -p "$out/measure"
    left=$(( ${ROUND_S:-540} - SECONDS - 20 ))
    if (( left > 60 )); then
        # shellcheck disable=SC2086  # MEASURE_ARGS: words on purpose
        timeout "$left" pycuda-heads efficiency --measure --time-budget $(( left - 30 )) --no-progress \
            ${MEASURE_ARGS:-} \
            > "$out/measure/measure.log" 2>&1; echo "rc=$?" >> "$out/measure/measure.log"
    fi
    cp -r reports/*/tuning "$out/measure/" 2>/dev/null
    pack measure
fi
