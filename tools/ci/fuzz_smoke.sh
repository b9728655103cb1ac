#!/usr/bin/env bash
# Fuzz smoke gate: builds every libFuzzer target of fuzz/ (make fuzz: clang,
# ASan + UBSan, libvisc instrumented too) and runs each for FUZZ_SECONDS on a
# scratch copy of its seed corpus fuzz/corpus/<target>/ (the checkout is
# never written). Any crash, leak, UBSan report, out-of-memory or input
# slower than FUZZ_TIMEOUT seconds fails the gate; the offending input is
# kept in $FUZZ_ARTIFACTS (default build-fuzz/artifacts/) for reproduction:
#   build-fuzz/fuzz/<target> build-fuzz/artifacts/<target>/crash-<hash>
#   FUZZ_SECONDS=N   seconds per target (default 20)
#   FUZZ_TARGETS=".." only these targets (default: every fuzz/fuzz_*.c)
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${FUZZ_SECONDS:-20}
timeout=${FUZZ_TIMEOUT:-10}
artifacts=${FUZZ_ARTIFACTS:-build-fuzz/artifacts}
targets=${FUZZ_TARGETS:-$(for f in fuzz/fuzz_*.c; do basename "$f" .c; done)}

make -j"${JOBS:-$(nproc)}" fuzz >/dev/null
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# fuzz_one T: one target's run into $scratch/T/ (log, and rc: its exit status).
fuzz_one() {
    local t=$1 rc=0
    mkdir -p "$scratch/$t/corpus" "$scratch/$t/out"
    cp -r "fuzz/corpus/$t/." "$scratch/$t/corpus/"
    # New finds go to the scratch corpus; crash files to the scratch out dir.
    "build-fuzz/fuzz/$t" -max_total_time="$seconds" -timeout="$timeout" -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$scratch/$t/out/" "$scratch/$t/corpus" \
        >"$scratch/$t/log" 2>&1 || rc=$?
    echo $rc >"$scratch/$t/rc"
}
# One target per core at a time (each is one process on one core, for
# FUZZ_SECONDS of wall time): the same fuzzing per target, half the wall
# time on 2 cores. The reports follow in the targets' order.
failed=()
ran=()
for t in $targets; do
    [ -d "fuzz/corpus/$t" ] || { echo "fuzz: no seed corpus fuzz/corpus/$t" >&2; failed+=("$t"); continue; }
    while [ "$(jobs -rp | wc -l)" -ge "${JOBS:-$(nproc)}" ]; do wait -n || true; done
    fuzz_one "$t" &
    ran+=("$t")
done
wait
for t in "${ran[@]}"; do
    log="$scratch/$t/log"
    if [ "$(cat "$scratch/$t/rc")" -eq 0 ]; then
        runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
        cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
        echo "fuzz: ok   $t: ${runs:-?} inputs in ${seconds}s, $cov"
    else
        echo "fuzz: FAIL $t"
        grep -E 'ERROR|SUMMARY|runtime error|Test unit written|deadly signal|timeout' "$log" | head -20 || true
        echo "---- last lines of the log ----"; tail -40 "$log"
        mkdir -p "$artifacts/$t"
        cp "$scratch/$t/out/"* "$artifacts/$t/" 2>/dev/null || true
        echo "fuzz: inputs kept in $artifacts/$t/; reproduce with build-fuzz/fuzz/$t <file>"
        failed+=("$t")
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz: FAIL: ${failed[*]}"
    exit 1
fi
echo "fuzz: ok: all targets ran ${seconds}s without a finding"
