#!/usr/bin/env bash
# Coverage gate: builds the library, the program and the unit tests with gcov
# instrumentation in build-cov/, runs the whole suite (unit tests and the
# tests/e2e_*.sh scripts), then prints line and branch coverage of src/ per
# folder and in total. Fails when a test fails or when total line coverage
# is below the floor.
#   COV_FLOOR=NN      line-coverage floor in percent (default below)
#   VISC_SKIP_E2E=1   skip the end-to-end scripts (quick local runs only);
#   VISC_SKIP_E2E="a.sh b.sh" skips those (CI leaves out the long training
#                     run, which adds no lines and has run in `make test`)
#   JOBS=N            parallel compile jobs (default: number of CPUs)
set -euo pipefail
cd "$(dirname "$0")/../.."
# The floor only goes up: 95.9% measured on 2026-11-29 (CI's run, the
# Fashion-MNIST training script left out); the issue's minimum is 85%.
# 95.2% on the run of 2026-12-05 (7cb0dcb; one thread, -O1,
# -fprofile-update=single), read with --gcov-ignore-parse-errors (below).
floor=${COV_FLOOR:-95}
build=build-cov
jobs=${JOBS:-$(nproc)}
# -O0 so that every source line maps to code gcov can count; the program's
# heavy lifting is in oneDNN, which is not instrumented, so the suite stays
# affordable. COV_OPT=-O1 trades some line precision for speed.
# -fprofile-update=single: with -fopenmp (which implies -pthread) GCC makes
# every counter increment an atomic read-modify-write (lock add), which
# made the instrumented tests 2.3x slower even on one thread
# (test_resnet_parity 49.5 s against 21.4 s, 2026-12-04); the pass runs one
# OpenMP thread, and a lost increment could only lower a count, never
# hide a line that ran.
flags=(BUILD=$build OPT="${COV_OPT:--O0} -g" SANFLAGS="--coverage -fprofile-update=single")

# Counters accumulate across runs: start from zero so the figure is this
# run's alone (stale .gcda files from an older build would also confuse gcov).
if [ -d $build ]; then find $build -name '*.gcda' -delete; fi
make -j"$jobs" "${flags[@]}" tests
make "${flags[@]}" test

[ -n "${VISC_SKIP_E2E:-}" ] && echo "coverage: VISC_SKIP_E2E=${VISC_SKIP_E2E}: the figure below leaves those e2e scripts out"
# Only the library and the program (src/) count: tests/ and fuzz/ would
# flatter the figure. Generated objects live under build-cov/, sources under src/.
# --gcov-ignore-parse-errors: with -fprofile-update=single (above), counters
# bumped from several threads at once (the data loader's workers in
# src/transforms/, a script's --threads 2 in src/models/) can lose
# increments, and gcov derives some branch counts by subtraction, so a few
# come out negative ("branch 3 taken -96"), a line gcovr 5.2 cannot parse
# and stops at: 3 files' worth in CI's run of 2026-12-05, which failed the
# pass. Those branch lines are left out of the branch figure (the count of
# them is printed); the line records are read as gcov wrote them.
json=$build/coverage.json
gcovr --root . --object-directory $build --filter 'src/' \
      --exclude-unreachable-branches --gcov-ignore-parse-errors --json-summary "$json" \
      --json-summary-pretty --txt $build/coverage.txt $build >/dev/null 2>$build/gcovr.err ||
    { cat $build/gcovr.err; echo "coverage: FAIL: gcovr failed"; exit 1; }
echo "coverage: $(grep -c 'Unrecognized GCOV output' $build/gcovr.err || true) gcov file(s) with lines gcovr could not parse (negative counts from racing threads), left out: $build/gcovr.err"
# gcovr depends on Debian's python3, so it is there.
/usr/bin/python3 tools/ci/coverage_summary.py "$json" "$floor"
