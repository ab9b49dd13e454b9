#!/usr/bin/env bash
# The GPU check: the one command to run on the lent GPU machine, from the repository root (CONTRIBUTING.md, "The GPU check").
#
#   bash scripts/device_check.sh [OUTDIR]          # on the GPU machine; needs device-kit/ (make device-kit, carried)
#   DEVICE_DRY_RUN=1 bash scripts/device_check.sh /tmp/dc   # the same steps on a CPU: Triton's interpreter, small shapes
#
# OUTDIR: $OUT when set (the device tool's output folder), else benchmarks/results/device-check. Steps, each under
# `timeout` with a budget (seconds; unused seconds carry over to the next step; BUDGET_<STEP>=S overrides one):
#   install 30: the kit into /tmp/deploytk-site (PYTHONPATH), then deploytk's CLI imports and the kit's deploytk is
#               this tree's (scripts/device_summary.py kit-check; dry run: the import only)
#   doctor 30: deploytk doctor --json                                  -> doctor.json
#   selftest 240: deploytk selftest --json, the Triton kernels natively -> selftest.json
#   gpu_tests 60: pytest -m gpu on the test files with gpu tests, less the selftest test (the step above) -> gpu_tests.json
#   kernel_bandwidth 30: benchmarks/kernel_bandwidth.py                 -> kernel_bandwidth.json
#   end_to_end_latency 150: benchmarks/end_to_end_latency.py --cuda-graphs -> end_to_end_latency.json
# 540 s in all, then the summary (scripts/device_summary.py, ~10 s): summary.json, printed last. The first H200 run
# (2026-11-28) needed about 210 s for the selftest (Triton's cache half warm) and 62 s for the gpu tests. Every step's output
# goes to device_check.log. A failed or timed-out step is recorded and the next one runs; the exit status is 1 if any
# step is not ok. PYTHON overrides the interpreter (default python3).
set -u -o pipefail

OUTDIR=${1:-${OUT:-}}
if [ -n "$OUTDIR" ]; then
    mkdir -p "$OUTDIR" && OUTDIR=$(cd "$OUTDIR" && pwd) || exit 2
fi
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
OUTDIR=${OUTDIR:-$ROOT/benchmarks/results/device-check}
PY=${PYTHON:-python3}
DRY=0
[ "${DEVICE_DRY_RUN:-0}" = 1 ] && DRY=1
SITE=/tmp/deploytk-site
KIT=${DEVICE_KIT:-device-kit}  # the kit's folder, from the repository root
METHOD_CONFIGS=export_configs/deit_small_mctf_r16.yaml,export_configs/deit_small_atm_calibrated.yaml,export_configs/deit_small_evit_k70.yaml,export_configs/deit_small_crucial_k70.yaml
RESULTS=(doctor.json selftest.json gpu_tests.json kernel_bandwidth.json end_to_end_latency.json summary.json device_check.log)

if [ "$DRY" = 0 ] && ! compgen -G "$KIT/*.whl" >/dev/null; then
    echo "error: $KIT/ has no wheels: run \`make device-kit\` on the development machine and carry $KIT (CONTRIBUTING.md, \"The GPU check\")" >&2
    exit 2
fi
mkdir -p "$OUTDIR" || exit 2
for f in "${RESULTS[@]}"; do rm -f "$OUTDIR/$f"; done
WORK=$(mktemp -d /tmp/device-check.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
LOG=$OUTDIR/device_check.log
STEPS=$WORK/steps.tsv
: >"$STEPS"

export PYTHONUNBUFFERED=1
if [ "$DRY" = 1 ]; then
    export TRITON_INTERPRET=1  # the kernels run in Triton's interpreter on CPU tensors
    export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
else
    unset TRITON_INTERPRET
    export PYTHONPATH=$SITE:$ROOT
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}  # the selftest's CPU references (tests/conftest.py would say 2)
fi

START=$(date +%s)
ALLOWED=0
FAILED=0
echo "deploytk GPU check $(date -u +%FT%TZ), dry run $DRY, $PY, outdir $OUTDIR" | tee "$LOG"

# step NAME BUDGET STDOUT_FILE RESULT_FILE COMMAND...: run COMMAND under timeout (its budget plus what earlier steps left),
# stdout to STDOUT_FILE (- : the log), stderr to the log; record name, status, exit code, seconds, limit and result file.
step() {
    local name=$1 budget=$2 stdout=$3 result=$4
    shift 4
    local override="BUDGET_${name^^}"
    ALLOWED=$((ALLOWED + ${!override:-$budget}))
    local limit=$((ALLOWED - ($(date +%s) - START)))
    [ "$limit" -lt 5 ] && limit=5
    local from
    from=$(($(wc -l <"$LOG") + 1))
    echo "== $name (limit ${limit}s): $*" >>"$LOG"
    local t0 t1 rc status
    t0=$(date +%s.%N)
    if [ "$stdout" = - ]; then
        timeout -k 5 "$limit" "$@" >>"$LOG" 2>&1
    else
        timeout -k 5 "$limit" "$@" >"$stdout" 2>>"$LOG"
    fi
    rc=$?
    t1=$(date +%s.%N)
    case $rc in
        0) status=ok ;;
        124 | 137) status=timeout ;;
        *) status=failed ;;
    esac
    local seconds
    seconds=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$rc" "$seconds" "$limit" "$result" >>"$STEPS"
    echo "== $name: $status (exit $rc, ${seconds}s of ${limit}s)" >>"$LOG"
    echo "[device-check] $name: $status (${seconds}s of ${limit}s)"
    if [ "$status" != ok ]; then
        FAILED=1
        echo "--- the end of its output (device_check.log):" && tail -n "+$from" "$LOG" | tail -n 15 | sed 's/^/    /'
    fi
}

install_kit() {
    if [ "$DRY" = 0 ]; then
        rm -rf "$SITE" &&
            "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check --target "$SITE" "$KIT"/*.whl ||
            return 1
    else
        echo "dry run: no kit installed; $PY's own packages"
    fi
    "$PY" scripts/device_summary.py kit-check
}

gpu_tests() {
    local files
    mapfile -t files < <(grep -rlE 'mark\.gpu\b' tests --include='test_*.py' | sort)
    echo "test files with gpu tests: ${files[*]}"
    # the selftest test repeats the selftest step (34 s of the 62 s on the H200)
    "$PY" -m pytest -m gpu -q -p no:cacheprovider --junitxml="$WORK/gpu_tests.xml" "${files[@]}" \
        --deselect tests/kernels/test_kernels_gpu.py::test_native_selftest_passes_for_every_op_and_dtype
    local rc=$?
    "$PY" scripts/device_summary.py junit "$WORK/gpu_tests.xml" "$OUTDIR/gpu_tests.json" || return 1
    return $rc
}

export DRY SITE KIT PY WORK OUTDIR
export -f install_kit gpu_tests

if [ "$DRY" = 1 ]; then
    SMALL=(--smoke)  # tiny shapes, 1 iteration, on CPU tensors
    E2E=(--smoke)
else
    SMALL=()
    E2E=(--warmup 5 --iterations 30 --cuda-graphs)
fi

step install 30 - "" bash -c install_kit
step doctor 30 "$OUTDIR/doctor.json" doctor.json "$PY" -m deploytk doctor --json
step selftest 240 "$OUTDIR/selftest.json" selftest.json "$PY" -m deploytk selftest --json
step gpu_tests 60 - gpu_tests.json bash -c gpu_tests
step kernel_bandwidth 30 - kernel_bandwidth.json "$PY" benchmarks/kernel_bandwidth.py "${SMALL[@]}" --output "$OUTDIR/kernel_bandwidth.json"
step end_to_end_latency 150 - end_to_end_latency.json "$PY" benchmarks/end_to_end_latency.py "${E2E[@]}" --eager-reference \
    --configs "$METHOD_CONFIGS" --output "$OUTDIR/end_to_end_latency.json"

echo "== summary after $(($(date +%s) - START))s" >>"$LOG"
SUMMARY_ARGS=("$OUTDIR" "$STEPS")
[ "$DRY" = 1 ] && SUMMARY_ARGS+=(--dry-run)
echo
timeout -k 5 60 "$PY" scripts/device_summary.py summary "${SUMMARY_ARGS[@]}" 2>>"$LOG" | tee -a "$LOG" || FAILED=1
exit $FAILED
