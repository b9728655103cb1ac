#!/usr/bin/env bash
# Runs every test binary in $1 and every tests/e2e_*.sh script, counts the
# "ok"/"FAIL" lines, and closes with "N passed, N failed".
set -u
dir=${1:-build/tests}
passed=0; failed=0
log=$(mktemp)
for bin in "$dir"/test_*; do
    [ -x "$bin" ] || continue
    case "$bin" in *.o|*.d) continue;; esac
    start=$(date +%s.%N)
    "$bin" >"$log" 2>&1
    rc=$?
    cat "$log"
    p=$(grep -c '^ok ' "$log"); f=$(grep -c '^FAIL ' "$log")
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "FAIL $(basename "$bin") (exit status $rc)"; f=1
    fi
    passed=$((passed + p)); failed=$((failed + f))
    printf '# %s: %d ok, %d failed, %.1fs\n' "$(basename "$bin")" "$p" "$f" "$(echo "$(date +%s.%N) - $start" | bc)"
done
# A build without the swarm (make SWARM=0: no libsodium / OpenDHT) has no
# swarm to test; every other build runs the swarm scripts.
has_swarm=1
"${VISC:-build/visc}" swarm --help >/dev/null 2>&1 || has_swarm=0
for script in tests/e2e_*.sh; do
    [ -f "$script" ] || continue
    case "$(basename "$script")" in
        e2e_swarm_*) if [ $has_swarm -eq 0 ]; then echo "# $(basename "$script"): not built (SWARM=0)"; continue; fi;;
    esac
    # VISC_SKIP_E2E=1 skips every script; a list of names skips those
    # (the coverage gate leaves out the long training run that `make test` has run).
    case " ${VISC_SKIP_E2E:-} " in
        " 1 "|*" $(basename "$script") "*) echo "# $(basename "$script"): not run here (VISC_SKIP_E2E)"; continue;;
    esac
    start=$(date +%s)
    if bash "$script" >"$log" 2>&1; then
        cat "$log"; echo "ok   $(basename "$script")"; passed=$((passed + 1))
    else
        cat "$log"; echo "FAIL $(basename "$script")"; failed=$((failed + 1))
    fi
    echo "# $(basename "$script"): $(( $(date +%s) - start ))s"
done
rm -f "$log"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
