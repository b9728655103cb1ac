#!/usr/bin/env bash
# tools/gpu/device_check.sh: the one script a session with a GPU machine
# runs (an H200 for ~15 minutes, once). It records the machine, builds the
# CUDA backend and the GPU test program, runs `make test-gpu` (every kernel
# against its CPU twin), then, where the machine has oneDNN and the other
# CPU libraries, the whole build, the models on the GPU against the CPU
# (tests/gpu/test_cuda_model.c) and the CUDA end-to-end check. Each part
# runs whatever happened before it and writes its own log to $OUT, so one
# failure never hides the others; summary.txt has one line per part.
#
#   bash tools/gpu/device_check.sh            # logs in $OUT (default build-gpu/device-out)
#   JOBS=16 BUILD=build-gpu bash tools/gpu/device_check.sh
#
# Exit status: 0 when the GPU build and test-gpu passed (the rest is
# informational: the device image may lack oneDNN), 1 otherwise. The
# benchmark joins as one more part: tools/gpu/bench.sh, run when present.
# Every part is bounded so the whole stays inside BUDGET seconds (default
# 540, under the device tool's 600 s per command); a part with no time
# left is reported as not run. At most 8 files land in $OUT (the tool
# returns no more).
set -u
cd "$(dirname "$0")/../.." || exit 1
BUILD=${BUILD:-build-gpu}
OUT=${OUT:-$PWD/$BUILD/device-out}
JOBS=${JOBS:-$(nproc)}
BUDGET=${BUDGET:-540}
deadline=$(($(date +%s) + BUDGET))
mkdir -p "$OUT"
summary=$OUT/summary.txt
gpu_test=$BUILD/tests/gpu/test_cuda_kernels
: >"$summary"
status=0

# part NAME REQUIRED COMMAND...: runs COMMAND with its output in $OUT/NAME.log,
# stopped (exit 124) when the budget runs out.
part() {
    local name=$1 required=$2 start rc left
    shift 2
    start=$(date +%s)
    left=$((deadline - start))
    if [ $left -lt 10 ]; then
        echo "$name: not run: the time budget is spent" | tee -a "$summary"
        [ "$required" = 1 ] && status=1
        return 1
    fi
    if declare -F "$1" >/dev/null; then export -f "$1"; fi # a function of this script
    timeout $left bash -c '"$@"' "$name" "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    printf '%-10s %s (exit %d, %ds)%s\n' "$name" "$([ $rc -eq 0 ] && echo ok || echo FAILED)" \
        $rc $(($(date +%s) - start)) "$([ "$required" = 1 ] || echo ', informational')" |
        tee -a "$summary"
    if [ $rc -ne 0 ] && [ "$required" = 1 ]; then status=1; fi
    return $rc
}

show_environment() {
    date -u
    uname -a
    nvidia-smi || echo "nvidia-smi: not available"
    command -v nvcc && nvcc --version
    gcc --version | head -1
    echo "CUDA_HOME=${CUDA_HOME:-} NVCC_EXTRA=${NVCC_EXTRA:-}"
    ls /usr/local/cuda/include/cublasLt.h /usr/local/cuda/lib64/libcudart_static.a 2>&1
    ldconfig -p | grep -E 'libcublasLt|libcudnn\.|libnccl|libdnnl' || echo "(none in ldconfig)"
    ls /usr/include/oneapi/dnnl/dnnl.h 2>&1
}

# cuBLASLt outside the toolkit (the nvidia-cublas wheel of PyTorch's
# environment): its header for nvcc, its library for dlopen.
find_cublaslt() {
    local nvcc_path home dir
    nvcc_path=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    home=${CUDA_HOME:-${nvcc_path%/bin/nvcc}}
    [ -f "$home/include/cublasLt.h" ] && return 0
    dir=$(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__))' \
        2>/dev/null) || return 0
    if [ -f "$dir/include/cublasLt.h" ]; then
        export NVCC_EXTRA="-I$dir/include"
        export LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        echo "cuBLASLt from $dir" | tee -a "$summary"
    fi
}

# The parts run in child shells (under timeout): they see these.
export BUILD JOBS gpu_test OUT
part environment 0 show_environment
find_cublaslt
gpu_targets=("$BUILD/libvisc_cuda.a" "$BUILD/tests/gpu/test_cuda_kernels")
# Each group of checks in a process of its own: a kernel that breaks the
# CUDA context in one group cannot hide the results of the others.
run_groups() {
    local g rc=0
    for g in $("$gpu_test" --list); do
        echo "=== $g"
        "$gpu_test" "$g" || rc=1
    done
    return $rc
}
# compute-sanitizer's memcheck: out-of-bounds and misaligned accesses that
# happen to give the right numbers.
run_memcheck() {
    local cs
    cs=$(command -v compute-sanitizer ||
        ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer \
            2>/dev/null | head -1)
    [ -n "$cs" ] || { echo "no compute-sanitizer here"; return 1; }
    "$cs" --tool memcheck --error-exitcode 9 "$gpu_test"
}
if part build-gpu 1 make -j"$JOBS" BUILD="$BUILD" CUDA=1 "${gpu_targets[@]}"; then
    part test-gpu 1 make BUILD="$BUILD" CUDA=1 GPU_REQUIRED=1 test-gpu ||
        part test-gpu-groups 0 run_groups
    grep -hE '^(FAIL|[0-9]+ passed)' "$OUT"/test-gpu*.log | tee -a "$summary"
    part memcheck 0 run_memcheck
    tail -3 "$OUT/memcheck.log" 2>/dev/null | tee -a "$summary"
else
    echo "test-gpu   not run: the GPU build failed" | tee -a "$summary"
    status=1
fi

# The whole program: the models on the GPU against the CPU, then the CUDA
# end-to-end check, which trains one epoch of Fashion-MNIST on the GPU and
# pretrains with MoCo v2 and SimCLR (1 and 2 processes) when the data came
# along: prepare it first with tools/gpu/prepare_data.sh (Fashion-MNIST and
# some CIFAR-10 JPEGs into build-gpu/data) and carry build-gpu/data (30 MB).
# Needs oneDNN & co. on the machine.
run_full() {
    make -j"$JOBS" BUILD="$BUILD" CUDA=1 all "$BUILD/tests/gpu/test_cuda_model" || return 1
    "$BUILD/visc" devices || return 1
    "$BUILD/tests/gpu/test_cuda_model" || return 1
    local images=$PWD/$BUILD/data/shared
    [ -d "$images" ] && export VISC_SHARED_DATA=$images
    VISC_GPU_MACHINE=1 VISC_FASHION_DIR=${VISC_FASHION_DIR:-$PWD/$BUILD/data} VISC="$BUILD/visc" \
        bash tests/e2e_cuda.sh
}
if [ -f /usr/include/oneapi/dnnl/dnnl.h ]; then
    part full 1 run_full
    grep -hE '^(FAIL|[0-9]+ passed|GPU[:,])' "$OUT/full.log" | tee -a "$summary"
else
    echo "build-all  not run: no oneDNN on this machine (only the GPU parts build here)" |
        tee -a "$summary"
fi

# The benchmark with what time is left (tools/gpu/bench.sh: $OUT/bench.md).
if [ -f tools/gpu/bench.sh ] && [ -f /usr/include/oneapi/dnnl/dnnl.h ]; then
    export BENCH_BUDGET=$((deadline - $(date +%s) - 15))
    part bench 0 bash tools/gpu/bench.sh "$BUILD"
fi

echo "device check: $([ $status -eq 0 ] && echo passed || echo FAILED); logs in $OUT" |
    tee -a "$summary"
exit $status
