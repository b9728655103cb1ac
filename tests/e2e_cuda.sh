#!/usr/bin/env bash
# The CUDA backend on a machine of the test suite (CI has no GPU): `visc
# devices` answers with or without the backend and without a GPU driver;
# where the backend is built, its library and the GPU test program exist,
# and the program either skips cleanly (exit 77, one line saying why) or,
# on a machine with a GPU, passes.
set -euo pipefail
V=${VISC:-build/visc}
build=$(dirname "$V")

out=$("$V" devices)
echo "$out"
grep -q '^cpu: [0-9]* threads$' <<<"$out"
grep -q '^cuda' <<<"$out"
! "$V" devices extra 2>/dev/null   # a usage error, not a listing

if grep -q '^cuda: not built' <<<"$out"; then
    echo "# CUDA backend not built (no nvcc/cuBLASLt, or CUDA=0): nothing more to check"
    exit 0
fi
[ -s "$build/libvisc_cuda.a" ]
gpu_test=$build/tests/gpu/test_cuda_kernels
[ -x "$gpu_test" ]
rc=0
log=$("$gpu_test") || rc=$?
echo "$log"
if [ $rc -eq 77 ]; then
    # No GPU: one line naming the reason, and `visc devices` agrees.
    [ "$(wc -l <<<"$log")" -eq 1 ]
    grep -q '^test_cuda_kernels: skipped: no GPU (.\+)$' <<<"$log"
    grep -q '^cuda: none usable (' <<<"$out"
    echo "# GPU tests skipped: no GPU here (make test-gpu runs them where there is one)"
else
    [ $rc -eq 0 ]
    grep -q '^[0-9]* passed, 0 failed$' <<<"$log"
fi
