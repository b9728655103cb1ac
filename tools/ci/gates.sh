#!/usr/bin/env bash
# Runs every quality gate in CI's order, each to completion even when an
# earlier one fails, then prints each gate's time and verdict; fails when
# any gate failed. Gates: GATES="format static asan fuzz coverage" (default).
#   format    tools/ci/format_check.sh   clang-format 14, .clang-format
#   static    tools/ci/static.sh         gcc -Werror build + cppcheck
#   asan      tools/ci/asan.sh           unit tests under ASan+UBSan+LSan
#   fuzz      tools/ci/fuzz_smoke.sh     each fuzz target FUZZ_SECONDS s
#   coverage  tools/ci/coverage.sh       unit tests + e2e with gcov, floor
set -uo pipefail
cd "$(dirname "$0")/../.."
gates=${GATES:-format static asan fuzz coverage}
summary=()
status=0
for g in $gates; do
    case $g in
    format) cmd=tools/ci/format_check.sh ;;
    static) cmd=tools/ci/static.sh ;;
    asan) cmd=tools/ci/asan.sh ;;
    fuzz) cmd=tools/ci/fuzz_smoke.sh ;;
    coverage) cmd=tools/ci/coverage.sh ;;
    *) echo "gates: unknown gate '$g'" >&2; exit 2 ;;
    esac
    echo "==== gate $g: $cmd"
    start=$(date +%s)
    if bash "$cmd"; then verdict=ok; else verdict=FAIL; status=1; fi
    summary+=("$(printf '%-9s %-4s %4ds' "$g" "$verdict" $(( $(date +%s) - start )))")
done
echo "==== gates"
printf '%s\n' "${summary[@]}"
exit $status
