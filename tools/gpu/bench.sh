#!/usr/bin/env bash
# tools/gpu/bench.sh BUILD: the CUDA issue's benchmark, one run on a GPU
# machine (tools/gpu/device_check.sh runs it as its last part): training
# images/s of visc (bench/bench_train --device cuda) against PyTorch eager
# and torch.compile (bench/torch_train_gpu.py: bf16 autocast, channels_last
# for the CNNs) for ResNet-50 (batch 256, 224 px), ViT-S/16 (256), Swin-T
# (256) and ResNet-18 with the CIFAR stem (512, 32 px), with each engine's
# device memory. Both engines keep their fixed batch, labels and loss on the
# device (bench_train: m->io_on_device) and queue their timed steps back
# to back with one wait at the end, so the step is measured, not the bus
# or the host's waits. Writes $OUT/bench.md (the table, with the command and the
# machine) and prints it. Every run is bounded by the time left (BENCH_BUDGET
# seconds, default 420); a run that does not finish is marked as such.
# After its timed steps each visc run profiles 3 more (bench_train
# --profile: GPU time per kernel, convolution and product), printed with
# every run's other output to standard error (device_check's bench.log).
# BENCH_MODELS (model names, space-separated) runs those rows alone: the
# rows a first call had no time for, in a second.
#
# visc runs with --precision bf16: its linear layers' products take bf16
# operands, and the ResNets keep their activations in bf16 channels-last
# (convolutions, batch norm, pooling and sums in bf16, as autocast with
# channels_last); the transformers' attention runs fused on tensor cores
# with bf16 operands, and what only a linear layer or attention reads is
# written in bf16 (q, k, v of ViT and Swin V1 and V2, the MLP's GELU, the norms
# before qkv and the MLP, attention's output), but their residual stream
# is still fp32 (as autocast keeps it), and the table says so rather than
# compare unlike precisions silently. Memory,
# one measure for both: the most the run's buffers held (visc: its
# allocation table, visc_cuda_memory_allocated, which counts every buffer:
# weights, gradients, optimizer state, the arena, workspaces; PyTorch:
# torch.cuda.max_memory_allocated); visc's log also says what the device
# held in all (cudaMemGetInfo, the libraries' code too).
# Then ViT-S once more with its attention as cuBLASLt's products
# (VISC_CUDA_ATTENTION=products), the fused kernels' own measure.
set -u
cd "$(dirname "$0")/../.." || exit 1
BUILD=${1:-${BUILD:-build-gpu}}
OUT=${OUT:-$PWD/$BUILD/device-out}
mkdir -p "$OUT"
budget=${BENCH_BUDGET:-420}
deadline=$(($(date +%s) + budget))
# (its output and the runs' errors go to this script's output: device_check
# keeps it as bench.log; $OUT holds few files)
make -j"$(nproc)" BUILD="$BUILD" CUDA=1 "$BUILD/bench/bench_train" ||
    { echo "bench: bench_train did not build"; exit 1; }
PY=${PYTHON:-python3}
have_torch=1
"$PY" -c 'import torch, timm; assert torch.cuda.is_available()' 2>/dev/null || have_torch=0

# result FIELD LINE: the value of FIELD= in a RESULT line
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$2"; }
# run COMMAND...: the RESULT line of COMMAND, or "not run"/"failed"; the
# rest of its output (visc's profile) to this script's standard error
run() {
    local left=$((deadline - $(date +%s))) out rc
    [ "$left" -gt 20 ] || { echo "not run"; return; }
    out=$(timeout "$left" "$@")
    rc=$?
    { echo "== $*"; grep -v '^RESULT' <<<"$out"; } >&2
    [ $rc -eq 0 ] || { echo "failed"; return; }
    grep '^RESULT' <<<"$out" | tail -1
}
# ratio A B: A / B as "1.23x", or "-" when either is missing
ratio() {
    if [ -n "$1" ] && [ -n "$2" ]; then awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2fx", a / b }'
    else echo "-"; fi
}
settings=(
    "resnet50 256 224 1000"
    "vit_small_patch16_224 256 224 1000"
    "swin_tiny_patch4_window7_224 256 224 1000"
    "resnet18 512 32 10 small"
)
{
    echo "# visc vs PyTorch on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
    echo
    echo "\`bash tools/gpu/bench.sh\`, $(date -u +%F). Training images/s (higher is better), device memory in MiB."
    echo
    echo "| model | batch | visc (bf16: ResNets throughout, transformers' products and GELU) | torch eager bf16 | torch.compile bf16 | visc / eager | visc / compile | memory visc / eager |"
    echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
} >"$OUT/bench.md"
for s in "${settings[@]}"; do
    read -r model batch res classes small <<<"$s"
    # BENCH_MODELS="resnet50 swin...": those rows alone (a second call's)
    if [ -n "${BENCH_MODELS:-}" ] && ! grep -qw -- "$model" <<<"$BENCH_MODELS"; then continue; fi
    flags=(--model "$model" --batch "$batch" --image-size "$res" --classes "$classes")
    [ -n "${small:-}" ] && flags+=(--small-stem)
    # the timed steps, then 3 under the profiler (GPU time per kind of work, into the log)
    v=$(run "$BUILD/bench/bench_train" "${flags[@]}" --device cuda --precision bf16 --warmup 3 \
        --steps 10 --quiet --profile 3)
    e="no torch" c="no torch"
    if [ $have_torch -eq 1 ]; then
        e=$(run "$PY" bench/torch_train_gpu.py "${flags[@]}")
        c=$(run "$PY" bench/torch_train_gpu.py "${flags[@]}" --compile)
    fi
    vi=$(field img_s "$v"); ei=$(field img_s "$e"); ci=$(field img_s "$c")
    vm=$(field mem_mib "$v"); em=$(field mem_mib "$e")
    printf '| %s | %s | %s | %s | %s | %s | %s | %s / %s |\n' "$model" "$batch" "${vi:-$v}" \
        "${ei:-$e}" "${ci:-$c}" "$(ratio "$vi" "$ei")" "$(ratio "$vi" "$ci")" "${vm:--}" "${em:--}" \
        >>"$OUT/bench.md"
done
[ $have_torch -eq 1 ] || echo "(no PyTorch with CUDA and timm here: the torch columns are empty)" >>"$OUT/bench.md"
# ResNet-50 once more with its convolutions' algorithms from cuDNN's timed
# search (--cudnn-benchmark, as PyTorch's runs above set cudnn.benchmark),
# where the table's visc column has the heuristic's (visc's default: the
# same algorithms, so the same bits, on every run). Last, so that the
# search's time cannot take the table's.
if [ -z "${BENCH_MODELS:-}" ] || grep -qw resnet50 <<<"$BENCH_MODELS"; then
    r=$(run "$BUILD/bench/bench_train" --model resnet50 --batch 256 --image-size 224 --classes 1000 \
        --device cuda --precision bf16 --warmup 3 --steps 10 --quiet --cudnn-benchmark)
    ri=$(field img_s "$r")
    echo "
ResNet-50 with --cudnn-benchmark (cuDNN's timed search): ${ri:-$r} img/s, $(field mem_mib "$r") MiB." \
        >>"$OUT/bench.md"
fi
[ -z "${BENCH_MODELS:-}" ] || grep -qw vit_small_patch16_224 <<<"$BENCH_MODELS" || exit 0
p=$(VISC_CUDA_ATTENTION=products run "$BUILD/bench/bench_train" --model vit_small_patch16_224 \
    --batch 256 --image-size 224 --classes 1000 --device cuda --precision bf16 --warmup 3 \
    --steps 10 --quiet)
pi=$(field img_s "$p")
echo "
ViT-S/16 with attention as cuBLASLt's products (VISC_CUDA_ATTENTION=products): ${pi:-$p} img/s, $(field mem_mib "$p") MiB." >>"$OUT/bench.md"
cat "$OUT/bench.md"
