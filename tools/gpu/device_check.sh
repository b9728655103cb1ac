#!/usr/bin/env bash
# tools/gpu/device_check.sh: the one script a session with a GPU machine
# runs (an H200 for ~15 minutes, once). It records the machine in
# summary.txt, builds the CUDA backend and the GPU test program, runs `make
# test-gpu` (every kernel against its CPU twin), then, with oneDNN and the
# other CPU libraries (the machine's, or the Debian packages that
# tools/gpu/pack_deps.sh puts in build-gpu/deps: the GPU image has none),
# the whole build and the models on the GPU against the CPU
# (tests/gpu/test_cuda_model.c), the benchmark (tools/gpu/bench.sh), the
# CUDA end-to-end check, and last compute-sanitizer's memcheck. Each part
# runs whatever happened before it and writes its own log to $OUT, so one
# failure never hides the others; summary.txt has one line per part.
#
#   here:  bash tools/gpu/pack_deps.sh && bash tools/gpu/prepare_data.sh
#   there: bash tools/gpu/device_check.sh   (carry build-gpu/deps, build-gpu/data)
#   JOBS=16 BUILD=build-gpu bash tools/gpu/device_check.sh
#
# PARTS="bench" (any of test-gpu models bench e2e memcheck, space-separated)
# runs those parts alone after the build: a second call on the same warm
# machine, whose build is still there, e.g. PARTS=bench BENCH_MODELS="...".
#
# Exit status: 0 when the GPU build and test-gpu passed and, where the
# whole program builds, the models and the end-to-end check too; 1
# otherwise (the benchmark and memcheck inform). Every part is bounded so
# the whole stays inside BUDGET seconds (default 540, under the device
# tool's 600 s per command); a part with no time left is reported as not
# run. At most 8 files land in $OUT (the tool returns no more): summary,
# build-gpu, test-gpu (or its groups, after a failure), models, bench,
# bench.md, e2e, memcheck.
set -u
cd "$(dirname "$0")/../.." || exit 1
BUILD=${BUILD:-build-gpu}
OUT=${OUT:-$PWD/$BUILD/device-out}
JOBS=${JOBS:-$(nproc)}
BUDGET=${BUDGET:-540}
deadline=$(($(date +%s) + BUDGET))
mkdir -p "$OUT"
summary=$OUT/summary.txt
PARTS=${PARTS:-all}
# wanted PART: whether PARTS names it
wanted() { [ "$PARTS" = all ] || grep -qw -- "$1" <<<"$PARTS"; }
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
    timeout -k 10 $left bash -c '"$@"' "$name" "$@" >"$OUT/$name.log" 2>&1
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

# cuBLASLt, cuDNN and NCCL where the toolkit lacks them (the image's may
# leave them to PyTorch's wheels): the headers that tools/gpu/pack_deps.sh
# carried (build-gpu/deps/cuda-include, searched after the toolkit's), and
# the libraries, found by name in the wheels or the usual places, for
# dlopen (LD_LIBRARY_PATH).
find_cuda_libraries() {
    local nvcc_path home lib path dir sp h deps=$PWD/$BUILD/deps
    nvcc_path=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    home=${CUDA_HOME:-${nvcc_path%/bin/nvcc}}
    for h in cublasLt.h cudnn.h nccl.h; do
        if [ ! -f "$home/include/$h" ] && [ -d "$deps/cuda-include" ]; then
            export NVCC_EXTRA="${NVCC_EXTRA:+$NVCC_EXTRA }-I$deps/cuda-include"
            echo "CUDA library headers from $deps/cuda-include (the toolkit has no $h)" |
                tee -a "$summary"
            break
        fi
    done
    sp=$(python3 -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null || true)
    for lib in libcublasLt.so.13 libcudnn.so.9 libnccl.so.2; do
        ldconfig -p | grep -q "$lib" && continue
        [ -e "$home/lib64/$lib" ] && continue
        path=""
        for dir in ${sp:+"$sp/nvidia"} /usr/local /usr/lib /opt; do
            [ -d "$dir" ] && path=$(find "$dir" -name "$lib" -print -quit 2>/dev/null)
            [ -n "$path" ] && break
        done
        if [ -z "$path" ]; then
            echo "$lib: not found on this machine" | tee -a "$summary"
            continue
        fi
        export LD_LIBRARY_PATH="${path%/*}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        echo "$lib from ${path%/*}" | tee -a "$summary"
    done
}

# The engine's Debian libraries (oneDNN, libjpeg-turbo, libpng, zlib's
# headers) that tools/gpu/pack_deps.sh carried as packages: unpacked into
# a prefix of their own (never into /), which CPATH, LIBRARY_PATH and
# LD_LIBRARY_PATH then name. The image has none of them; without them only
# the kernels' test builds.
use_deps() {
    local deps=$PWD/$BUILD/deps root deb inc lib
    [ -d "$deps/debs" ] || return 0
    root=$deps/root
    rm -rf "$root"
    mkdir -p "$root"
    for deb in "$deps"/debs/*.deb; do
        if command -v dpkg-deb >/dev/null; then
            dpkg-deb -x "$deb" "$root"
        else # Debian 12's packages hold data.tar.xz
            ar p "$deb" data.tar.xz | tar -xJ -C "$root"
        fi || { echo "deps: could not unpack $deb" | tee -a "$summary"; return 1; }
    done
    inc=$root/usr/include
    lib=$root/usr/lib/x86_64-linux-gnu
    export CPATH="$inc:$inc/x86_64-linux-gnu${CPATH:+:$CPATH}"
    export LIBRARY_PATH="$lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
    export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "Debian libraries from $deps: $(ls "$deps/debs" | wc -l) packages" | tee -a "$summary"
}

# oneDNN's header, the system's or the carried one's
have_dnnl() {
    [ -f /usr/include/oneapi/dnnl/dnnl.h ] || [ -f "$PWD/$BUILD/deps/root/usr/include/oneapi/dnnl/dnnl.h" ]
}

# The parts run in child shells (under timeout): they see these.
export BUILD JOBS gpu_test OUT
show_environment >>"$summary" 2>&1
find_cuda_libraries
use_deps
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
gpu_ok=0
if part build-gpu 1 make -j"$JOBS" BUILD="$BUILD" CUDA=1 "${gpu_targets[@]}"; then
    if ! wanted test-gpu; then
        gpu_ok=1
    elif part test-gpu 1 make BUILD="$BUILD" CUDA=1 GPU_REQUIRED=1 test-gpu; then
        gpu_ok=1
    else
        part test-gpu-groups 0 run_groups
    fi
    wanted test-gpu && grep -hE '^(FAIL|[0-9]+ passed)' "$OUT"/test-gpu*.log | tee -a "$summary"
else
    echo "test-gpu   not run: the GPU build failed" | tee -a "$summary"
    status=1
fi

# The whole program (needs oneDNN & co.: the machine's, or carried by
# tools/gpu/pack_deps.sh), in the order that puts the benchmark before
# what is slow and only informs: the models on the GPU against the CPU;
# the benchmark (tools/gpu/bench.sh: $OUT/bench.md), with the time left
# but E2E_RESERVE seconds; the CUDA end-to-end check, which trains one
# epoch of Fashion-MNIST on the GPU and pretrains with MoCo v2 and SimCLR
# (1 and 2 processes) when the data came along: prepare it first with
# tools/gpu/prepare_data.sh (Fashion-MNIST and some CIFAR-10 JPEGs into
# build-gpu/data) and carry build-gpu/data (30 MB).
run_models() {
    make -j"$JOBS" BUILD="$BUILD" CUDA=1 all "$BUILD/tests/gpu/test_cuda_model" \
        "$BUILD/bench/bench_train" || return 1
    "$BUILD/visc" devices || return 1
    "$BUILD/tests/gpu/test_cuda_model"
}
run_e2e() {
    local images=$PWD/$BUILD/data/shared
    [ -d "$images" ] && export VISC_SHARED_DATA=$images
    VISC_GPU_MACHINE=1 VISC_FASHION_DIR=${VISC_FASHION_DIR:-$PWD/$BUILD/data} VISC="$BUILD/visc" \
        bash tests/e2e_cuda.sh
}
if have_dnnl; then
    if wanted models; then
        part models 1 run_models
        grep -hE '^(FAIL|[0-9]+ passed)' "$OUT/models.log" | tee -a "$summary"
    fi
    if wanted bench && [ -f tools/gpu/bench.sh ]; then
        reserve=${E2E_RESERVE:-120}
        wanted e2e || reserve=10
        export BENCH_BUDGET=$((deadline - $(date +%s) - reserve))
        part bench 0 bash tools/gpu/bench.sh "$BUILD"
    fi
    if wanted e2e; then
        part e2e 1 run_e2e
        grep -hE '^(FAIL|GPU[:,])' "$OUT/e2e.log" | tee -a "$summary"
    fi
else
    echo "build-all  not run: no oneDNN on this machine and none carried (tools/gpu/pack_deps.sh): only the GPU parts build here" |
        tee -a "$summary"
fi

# Last, with whatever time is left (and only after a clean test-gpu: its
# groups' log takes the place of this one among the files that come back).
wanted memcheck && [ $gpu_ok -eq 1 ] && part memcheck 0 run_memcheck &&
    tail -3 "$OUT/memcheck.log" | tee -a "$summary"

echo "device check: $([ $status -eq 0 ] && echo passed || echo FAILED); logs in $OUT" |
    tee -a "$summary"
exit $status
