#!/usr/bin/env bash
# Runs every test binary in $1 and every tests/e2e_*.sh script, counts the
# "ok"/"FAIL" lines, and closes with "N passed, N failed".
#
# The tests named in tests/concurrent_tests mostly wait (see there): the
# binaries among them run in the background while the other binaries run,
# the scripts among them three at a time before the other scripts. Each
# test's output is printed whole once it has finished, so logs never mix.
set -u
dir=${1:-build/tests}
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
concurrent=" $(grep -v '^#' tests/concurrent_tests | tr '\n' ' ') "
is_concurrent() { [[ "$concurrent" == *" $1 "* ]]; }

# run_one KIND PATH: runs one test into $logs/NAME.{log,rc,time}. A binary
# passes by its "ok"/"FAIL" lines (and exit status), a script by its exit
# status.
run_one() {
    local name start; name=$(basename "$2"); start=$(date +%s.%N)
    if [ "$1" = bin ]; then "$2" >"$logs/$name.log" 2>&1; else bash "$2" >"$logs/$name.log" 2>&1; fi
    echo $? >"$logs/$name.rc"
    echo "$(date +%s.%N) - $start" | bc >"$logs/$name.time"
}

# run_pool CAP KIND PATH...: at most CAP of them at a time.
run_pool() {
    local cap=$1 kind=$2; shift 2
    for path in "$@"; do
        while [ "$(jobs -rp | wc -l)" -ge "$cap" ]; do wait -n; done
        run_one "$kind" "$path" &
    done
    wait
}

passed=0; failed=0
# report KIND PATH: prints a finished test's log and verdict and counts it.
report() {
    local name p f rc; name=$(basename "$2"); rc=$(cat "$logs/$name.rc")
    cat "$logs/$name.log"
    if [ "$1" = bin ]; then
        p=$(grep -c '^ok ' "$logs/$name.log"); f=$(grep -c '^FAIL ' "$logs/$name.log")
        if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then echo "FAIL $name (exit status $rc)"; f=1; fi
        printf '# %s: %d ok, %d failed, %.1fs\n' "$name" "$p" "$f" "$(cat "$logs/$name.time")"
    else
        if [ "$rc" -eq 0 ]; then echo "ok   $name"; p=1; f=0; else echo "FAIL $name"; p=0; f=1; fi
        printf '# %s: %.0fs\n' "$name" "$(cat "$logs/$name.time")"
    fi
    passed=$((passed + p)); failed=$((failed + f))
}

bins=(); waiting_bins=()
for bin in "$dir"/test_*; do
    [ -x "$bin" ] || continue
    case "$bin" in *.o|*.d) continue;; esac
    if is_concurrent "$(basename "$bin")"; then waiting_bins+=("$bin"); else bins+=("$bin"); fi
done
run_pool "${#waiting_bins[@]}" bin "${waiting_bins[@]}" &
pool=$!
for bin in "${bins[@]}"; do run_one bin "$bin"; report bin "$bin"; done
wait $pool
for bin in "${waiting_bins[@]}"; do report bin "$bin"; done

# A build without the swarm (make SWARM=0: no libsodium / OpenDHT) has no
# swarm to test; every other build runs the swarm scripts.
has_swarm=1
"${VISC:-build/visc}" swarm --help >/dev/null 2>&1 || has_swarm=0
scripts=(); waiting_scripts=(); declare -A waiting=()
for script in tests/e2e_*.sh; do
    [ -f "$script" ] || continue
    name=$(basename "$script")
    case "$name" in
        e2e_swarm_*) if [ $has_swarm -eq 0 ]; then echo "# $name: not built (SWARM=0)"; continue; fi;;
    esac
    # VISC_SKIP_E2E=1 skips every script; a list of names skips those
    # (the coverage gate leaves out the long training run that `make test` has run).
    case " ${VISC_SKIP_E2E:-} " in
        " 1 "|*" $name "*) echo "# $name: not run here (VISC_SKIP_E2E)"; continue;;
    esac
    if is_concurrent "$name"; then waiting[$name]=$script; else scripts+=("$script"); fi
done
# the waiting scripts in the order tests/concurrent_tests lists them (longest first)
for name in $concurrent; do
    [ -n "${waiting[$name]:-}" ] && waiting_scripts+=("${waiting[$name]}")
done
run_pool 3 script "${waiting_scripts[@]}"
for script in "${waiting_scripts[@]}"; do report script "$script"; done
for script in "${scripts[@]}"; do run_one script "$script"; report script "$script"; done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
