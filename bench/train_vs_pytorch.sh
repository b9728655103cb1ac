#!/usr/bin/env bash
# train_vs_pytorch.sh: visc against PyTorch, same models, batch and machine, one run.
#
# For each setting, runs $BUILD/bench/bench_train (BUILD=build unless set) and bench/torch_train.py
# alternately (visc, torch, visc, torch, ...) so that a change of machine
# load hits both alike, then prints the medians: images/s of each, their
# ratio (median of the per-pair ratios), visc's achieved GFLOP/s and its
# share of the measured dnnl_sgemm peak, and the same ratio in CPU time
# (images per CPU-second; see bench_train.c), which a busy machine disturbs
# less than the wall clock.
#
# Both engines get the same OpenMP settings (both use libgomp and oneDNN
# 2.6): OMP_NUM_THREADS=--threads and OMP_WAIT_POLICY=passive by default,
# because spin-waiting threads collapse when the cores are shared (measured
# 3-10x slower for both at load 6 on 2 cores); --wait-policy default keeps
# libgomp's spinning. PyTorch also gets the OpenBLAS core type that suits
# this CPU (openblas_coretype below: SkylakeX with AVX-512, Zen or Haswell
# with AVX2; Debian's OpenBLAS misdetects these CPUs) and, on its first run
# per setting, picks NCHW or channels_last, whichever is faster; later runs
# reuse that choice.
#
# --precision bf16 runs visc's linear-layer matmuls with bf16 operands and
# fp32 accumulation (bench_train --precision; fp32 on CPUs without
# avx512_bf16); PyTorch stays fp32. The table names visc's precision.
#
# usage: bench/train_vs_pytorch.sh [--repeats 3] [--threads 2] [--only r18|r50|vit32|swin|vit224]
#            [--steps18 10] [--steps50 3] [--wait-policy passive|active|default] [--quick]
#            [--precision fp32|bf16]
# Takes ~3-6 minutes on the 2-core machine at the default settings.
set -euo pipefail
cd "$(dirname "$0")/.."

repeats=3 threads=2 only="" steps18=10 steps50=3 wait_policy=passive precision=fp32
while [ $# -gt 0 ]; do
    case "$1" in
    --repeats) repeats=$2; shift ;;
    --threads) threads=$2; shift ;;
    --only) only=$2; shift ;;
    --steps18) steps18=$2; shift ;;
    --steps50) steps50=$2; shift ;;
    --wait-policy) wait_policy=$2; shift ;;
    --quick) repeats=1 steps18=4 steps50=2 ;;
    --precision) precision=$2; shift ;;
    -h | --help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
    esac
    shift
done

BUILD=${BUILD:-build}
BENCH=$BUILD/bench/bench_train
PY=/usr/bin/python3
# The reference side: Debian's PyTorch on OpenBLAS (without it, Debian's
# torch falls back to the reference BLAS at ~8 GFLOP/s and every linear
# layer crawls) and timm for the transformers.
bash tools/install_deps.sh python3-torch python3-torchvision libopenblas0-pthread
"$PY" -c "import timm" 2>/dev/null || "$PY" -m pip install -q --break-system-packages timm==0.9.16
[ -x "$BENCH" ] || make -s -j2 BUILD="$BUILD" "$BENCH"

# Debian's OpenBLAS misdetects these virtual CPUs and falls back to a slow
# generic kernel; forcing SkylakeX where there is no AVX-512 dies of an
# illegal instruction (the AVX2 EPYC CI machines). 2048^3 sgemm on 2 cores
# of that EPYC: Zen 60, Haswell 48, undetected 43 GFLOP/s.
openblas_coretype() {
    local flags vendor
    flags=$(grep -m1 '^flags' /proc/cpuinfo)
    vendor=$(sed -n 's/^vendor_id\s*: //p' /proc/cpuinfo | head -1)
    if [[ " $flags " == *" avx512f "* ]]; then echo SkylakeX
    elif [[ " $flags " == *" avx2 "* && "$vendor" == AuthenticAMD ]]; then echo Zen
    elif [[ " $flags " == *" avx2 "* ]]; then echo Haswell
    fi
}
export OMP_NUM_THREADS=$threads
OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-$(openblas_coretype)}
[ -n "$OPENBLAS_CORETYPE" ] && export OPENBLAS_CORETYPE
if [ "$wait_policy" = default ]; then unset OMP_WAIT_POLICY; else export OMP_WAIT_POLICY=$wait_policy; fi

# settings: tag model batch res warmup steps
settings=()
[ "$only" = "" ] || [ "$only" = r18 ] && settings+=("r18 resnet18 128 32 2 $steps18")
[ "$only" = "" ] || [ "$only" = r50 ] && settings+=("r50 resnet50 16 224 1 $steps50")
# transformers (issue 3): ViT-Ti at 32 px (patch 4), Swin-T and ViT-Ti/16 at 224 px
[ "$only" = "" ] || [ "$only" = vit32 ] && settings+=("vit32 vit_tiny_patch4_32 128 32 1 $steps18")
[ "$only" = "" ] || [ "$only" = swin ] && settings+=("swin swin_tiny_patch4_window7_224 16 224 1 $steps50")
[ "$only" = "" ] || [ "$only" = vit224 ] && settings+=("vit224 vit_tiny_patch16_224 32 224 1 $steps50")

field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$2"; }
median() { sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
load() { cut -d' ' -f1 /proc/loadavg; }

echo "visc vs PyTorch training speed: $(nproc) cores, OMP_NUM_THREADS=$threads," \
     "OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-default}, $repeats interleaved repeats, medians," \
     "visc $precision / torch fp32"
echo "cpu: $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)," \
     "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}"
load_start=$(load)
rows=()
for s in "${settings[@]}"; do
    read -r tag model batch res warmup steps <<<"$s"
    common=(--model "$model" --batch "$batch" --image-size "$res" --classes 10
            --warmup "$warmup" --steps "$steps" --threads "$threads" --quiet)
    fmt=auto
    vi=() ti=() ratios=() cratios=() gf=() pk=() loads=()
    for ((r = 1; r <= repeats; r++)); do
        loads+=("$(load)")
        v=$("$BENCH" "${common[@]}" --precision "$precision" | grep '^RESULT')
        t=$("$PY" bench/torch_train.py "${common[@]}" --channels-last "$fmt" | grep '^RESULT')
        fmt_used=$(field format "$t")
        [ "$fmt" = auto ] && { [ "$fmt_used" = channels_last ] && fmt=on || fmt=off; }
        vi+=("$(field img_s "$v")") ti+=("$(field img_s "$t")")
        gf+=("$(field gflops "$v")") pk+=("$(field peak "$v")")
        ratios+=("$(awk -v a="${vi[-1]}" -v b="${ti[-1]}" 'BEGIN {printf "%.3f", a / b}')")
        cratios+=("$(awk -v a="$(field cpu_img_s "$v")" -v b="$(field cpu_img_s "$t")" \
            'BEGIN {printf "%.3f", a / b}')")
        printf '  %s run %d/%d (load %s): visc %7.1f img/s (fwd %s bwd %s opt %s ms), torch %7.1f img/s (%s), CPU ratio %s\n' \
            "$tag" "$r" "$repeats" "${loads[-1]}" "${vi[-1]}" "$(field fwd_ms "$v")" \
            "$(field bwd_ms "$v")" "$(field opt_ms "$v")" "${ti[-1]}" "$fmt_used" "${cratios[-1]}"
    done
    mv=$(printf '%s\n' "${vi[@]}" | median) mt=$(printf '%s\n' "${ti[@]}" | median)
    mr=$(printf '%s\n' "${ratios[@]}" | median) mg=$(printf '%s\n' "${gf[@]}" | median)
    mc=$(printf '%s\n' "${cratios[@]}" | median)
    mp=$(printf '%s\n' "${pk[@]}" | median) ml=$(printf '%s\n' "${loads[@]}" | median)
    vp=$(field precision "$v")
    rows+=("$(printf '| %-30s | %5s | %4s | %-4s | %10.1f | %11.1f | %5.2fx | %12.1f | %10.1f | %5.0f%% | %8.2fx | %-13s | %4s |' \
        "$model" "$batch" "$res" "$vp" "$mv" "$mt" "$mr" "$mg" "$mp" \
        "$(awk -v g="$mg" -v p="$mp" 'BEGIN {print 100 * g / p}')" "$mc" "$fmt_used" "$ml")")
done

echo
echo "| model                          | batch |  res | prec | visc img/s | torch img/s | ratio  | visc GFLOP/s | sgemm peak | % peak | CPU ratio | torch format  | load |"
echo "| ------------------------------ | ----- | ---- | ---- | ---------- | ----------- | ------ | ------------ | ---------- | ------ | --------- | ------------- | ---- |"
printf '%s\n' "${rows[@]}"
echo "load average (1 min): $load_start at start, $(load) at end; targets: ratio >= 1.5 (ResNets, ViTs), >= 2 (Swin-T)"
