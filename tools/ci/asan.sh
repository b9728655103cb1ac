#!/usr/bin/env bash
# Sanitizer gate: `make asan` (ASan + UBSan, LeakSanitizer on, any UBSan
# report aborts) over the unit tests and the end-to-end scripts in
# build-asan/, so the error paths of bad input run under the sanitizers too.
# The training runs (tools/ci/training_runs) are left out (many minutes
# under ASan; the plain suite runs them; ASAN_E2E=all includes them). Any
# sanitizer report fails a test binary and so the gate.
# Leak suppressions, third-party libraries only: tools/ci/lsan.supp.
set -euo pipefail
cd "$(dirname "$0")/../.."
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tools/ci/lsan.supp:print_suppressions=0}
if [ "${ASAN_E2E:-}" != all ]; then VISC_SKIP_E2E="$(grep -v "^#" tools/ci/training_runs)"; export VISC_SKIP_E2E; fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
rc=0
make -j"${JOBS:-$(nproc)}" asan >"$log" 2>&1 || rc=$?
grep -vE '^(cc|gcc|ar) |^make' "$log" || true
# A report that slipped past a test's exit status still fails the gate.
if grep -qE '^==[0-9]+==ERROR|^SUMMARY: [A-Za-z]*Sanitizer|runtime error:' "$log"; then
    echo "asan: FAIL: sanitizer report above"; exit 1
fi
[ $rc -eq 0 ] || { echo "asan: FAIL: build or test failures above (make exit status $rc)"; exit 1; }
echo "asan: ok"
