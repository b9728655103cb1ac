#!/usr/bin/env bash
# Static gate: (1) the library, program, tests and benchmarks build with
# gcc and zero warnings (-Werror, the Makefile's warning set, the normal -O3
# so that flow-based warnings such as -Wmaybe-uninitialized are on), in
# build-werror/; (2) cppcheck finds nothing in src/ tests/ fuzz/ bench/.
# cppcheck's configuration is checked in: tools/ci/cppcheck.cfg (what it
# cannot infer about our headers) and tools/ci/cppcheck-suppressions.txt
# (false positives that cannot be suppressed inline, each with its reason);
# everything else is suppressed inline with "cppcheck-suppress id ; reason".
set -euo pipefail
cd "$(dirname "$0")/../.."
jobs=${JOBS:-$(nproc)}

echo "static: -Werror build (gcc)"
make -j"$jobs" BUILD="${STATIC_BUILD:-build-werror}" WERROR=1 all tests bench >/dev/null

echo "static: cppcheck $(cppcheck --version | sed 's/^Cppcheck //')"
cppcheck --std=c11 -D_GNU_SOURCE -Iinclude -Itests \
    --library=tools/ci/cppcheck.cfg --suppressions-list=tools/ci/cppcheck-suppressions.txt \
    --enable=warning,performance,portability --inline-suppr --error-exitcode=1 \
    -j"$jobs" -q src tests fuzz bench
echo "static: ok"
