#!/usr/bin/env bash
# The CUDA backend on a machine of the test suite (CI has no GPU): `visc
# devices` answers with or without the backend and without a GPU driver;
# `--device` is parsed (train and pretrain); without a GPU, --device cuda
# says so in one line and exits non-zero (what is not on the GPU yet is
# refused in one line too: tests/e2e_gpu_standin.sh, which gets past the
# opening). Where the backend is built, its library and
# the GPU test programs exist, and each either skips cleanly (exit 77, one
# line saying why) or, on a machine with a GPU, passes. With a GPU, a
# ResNet-14 also trains one epoch of Fashion-MNIST on it (when the data is
# there), and the CPU evaluates the model it saved to the accuracy it logged;
# MoCo v2 and SimCLR pretrain there against the CPU (with CIFAR-10 JPEGs:
# ../shared/data, or VISC_SHARED_DATA), and 2 processes against 1.
set -euo pipefail
V=${VISC:-build/visc}
source tests/lib.sh
build=$(dirname "$V")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

out=$("$V" devices)
echo "$out"
grep -q '^cpu: [0-9]* threads$' <<<"$out"
grep -q '^cuda' <<<"$out"
if "$V" devices extra 2>/dev/null; then # a usage error, not a listing
    echo "visc devices extra exited 0" >&2; exit 1
fi

# fails FLAGS... : the run exits non-zero with exactly one line on stderr; prints it
fails() {
    local rc=0
    "$V" "$@" --output "$tmp/refused" >"$tmp/out" 2>"$tmp/err" || rc=$?
    [ $rc -ne 0 ] || { echo "FAIL: '$*' succeeded"; exit 1; }
    [ "$(wc -l <"$tmp/err")" -eq 1 ] || { echo "FAIL: '$*' said:"; cat "$tmp/err"; exit 1; }
    cat "$tmp/err"
}
# The refusals come after the data is loaded. The test suite has Fashion-MNIST
# and the CIFAR-10 JPEGs; a GPU machine may lack them (VISC_GPU_MACHINE=1,
# set by tools/gpu/device_check.sh), which then leaves these checks out.
data=${VISC_FASHION_DIR:-/usr/share/datasets/fashion-mnist}
have_data=1
[ -e "$data/train-images-idx3-ubyte.gz" ] && [ -d "$shared/cifar10/train" ] || have_data=0
if [ $have_data -eq 0 ] && [ "${VISC_GPU_MACHINE:-0}" != 1 ]; then
    echo "FAIL: no Fashion-MNIST in $data or no CIFAR-10 JPEGs in $shared"
    exit 1
fi
small=(--dataset fashion-mnist --data "$data" --model resnet14 --epochs 1 --max-steps 1
       --batch-size 8 --no-progress)
grep -q "expected cpu, cuda or cuda:N, got 'tpu'" <<<"$(fails train "${small[@]}" --device tpu)"
grep -q "expected cpu, cuda or cuda:N, got 'cuda:x'" <<<"$(fails train "${small[@]}" --device cuda:x)"
grep -q "expected cpu, cuda or cuda:N, got 'tpu'" \
    <<<"$(fails pretrain --data imagefolder:/nonexistent --device tpu)"
if [ $have_data -eq 1 ]; then
    cifar_subset "$tmp/data" 2 1
    export VISC_CACHE_DIR="$tmp/cache"
    ssl=(pretrain --data "imagenet:$tmp/data" --model resnet14 --width 16 --input-size 32
         --batch-size 10 --bank-size 20 --epochs 1 --no-progress --workers 1)
else
    echo "# no Fashion-MNIST / CIFAR-10 JPEGs on this GPU machine: the checks after loading are left out"
fi

if grep -q '^cuda: not built' <<<"$out"; then
    if [ $have_data -eq 1 ]; then
        grep -q "built without the CUDA backend" <<<"$(fails train "${small[@]}" --device cuda)"
        grep -q "built without the CUDA backend" <<<"$(fails "${ssl[@]}" --device cuda)"
    fi
    echo "# CUDA backend not built (no nvcc/cuBLASLt, or CUDA=0): nothing more to check"
    exit 0
fi
[ -s "$build/libvisc_cuda.a" ]
if grep -q '^cuda: none usable (' <<<"$out" && [ $have_data -eq 1 ]; then
    grep -q -- "--device cuda:0: no usable GPU (" <<<"$(fails train "${small[@]}" --device cuda)"
    grep -q -- "--device cuda:3: no usable GPU (" <<<"$(fails train "${small[@]}" --device cuda:3)"
    grep -q -- "--device cuda:0: no usable GPU (" <<<"$(fails "${ssl[@]}" --device cuda)"
fi
gpu=0
for prog in test_cuda_kernels test_cuda_model; do
    p=$build/tests/gpu/$prog
    [ -x "$p" ]
    rc=0
    log=$("$p") || rc=$?
    echo "$log"
    if [ $rc -eq 77 ]; then
        # No GPU: one line naming the reason, and `visc devices` agrees.
        [ "$(wc -l <<<"$log")" -eq 1 ]
        grep -q "^$prog: skipped: no GPU (.\+)$" <<<"$log"
        grep -q '^cuda: none usable (' <<<"$out"
    else
        [ $rc -eq 0 ]
        grep -q '^[0-9]* passed, 0 failed$' <<<"$log"
        gpu=1
    fi
done
if [ $gpu -eq 0 ]; then
    echo "# GPU tests skipped: no GPU here (make test-gpu and test-gpu-model run them where there is one)"
    exit 0
fi

# A GPU: one epoch of the README's model on it.
if [ ! -e "$data/train-images-idx3-ubyte.gz" ]; then
    echo "# no Fashion-MNIST in $data (VISC_FASHION_DIR): the GPU training run is left out"
    exit 0
fi
"$V" train --config configs/fashion_mnist.ini --data "$data" --epochs 1 --warmup-epochs 0.3 \
    --device cuda --no-progress --print-freq 100 --output "$tmp/gpu" | tee "$tmp/gpu.log"
grep -q ', on cuda$' <(head -1 "$tmp/gpu.log")
grep '^GPU memory: [0-9]* MiB held by this run' "$tmp/gpu.log"
top1=$(grep '"type":"val"' "$tmp/gpu/log.jsonl" | tail -1 | sed 's/.*"top1":\([0-9.]*\).*/\1/')
echo "GPU: one epoch, test top-1 $top1%"
# The same command on the CPU ends at 88.6% (2 cores, 2026-11-30); the GPU
# adds in other orders, so the runs part after a few steps: 85% leaves room.
awk -v a="$top1" 'BEGIN { exit !(a >= 85.0) }' || { echo "FAIL: below 85% after one epoch"; exit 1; }
# the checkpoint is an ordinary one: the CPU evaluates it to the logged accuracy
cpu=$("$V" train --config configs/fashion_mnist.ini --data "$data" \
    --weights "$tmp/gpu/model_last.safetensors" --evaluate)
echo "$cpu"
awk -v a="$top1" -v b="$(sed 's/.*top1 \([0-9.]*\)%.*/\1/' <<<"$cpu")" \
    'BEGIN { exit !(a - b < 0.05 && b - a < 0.05) }' ||
    { echo "FAIL: the CPU evaluates the GPU's model to another accuracy than logged ($top1)"; exit 1; }
# The same epoch in bf16 (the ResNet's activations bf16 channels-last, its
# convolutions and the classifier with bf16 operands, fp32 accumulation):
# it must learn as well. Its convolutions' algorithms come from cuDNN's
# timed search (--cudnn-benchmark; the benchmark and test_cuda_model run
# the heuristic's in bf16).
"$V" train --config configs/fashion_mnist.ini --data "$data" --epochs 1 --warmup-epochs 0.3 \
    --device cuda --precision bf16 --cudnn-benchmark --no-progress --print-freq 100 \
    --output "$tmp/gpu-bf16" |
    tee "$tmp/gpu-bf16.log"
grep -q ', bf16 matmuls, on cuda$' <(head -1 "$tmp/gpu-bf16.log")
top1=$(grep '"type":"val"' "$tmp/gpu-bf16/log.jsonl" | tail -1 | sed 's/.*"top1":\([0-9.]*\).*/\1/')
echo "GPU, bf16: one epoch, test top-1 $top1%"
awk -v a="$top1" 'BEGIN { exit !(a >= 85.0) }' || { echo "FAIL: bf16 below 85% after one epoch"; exit 1; }
# MoCo v2 on the GPU (both encoders and heads, the momentum update, the
# embeddings' normalization, InfoNCE against the bank's copy there; the
# 20-key bank wraps every 2 steps): 4 steps end
# where the CPU's 4 end, the query encoder's change within 1e-3 normwise
# (a ViT: no BatchNorm; SGD: Adam would turn the GPU's other rounding of a
# near-zero gradient into a whole step). The base: 1 step at lr 1e-30.
if [ $have_data -eq 1 ]; then
    moco=("${ssl[@]}" --model vit_pico_patch4_28 --opt sgd --lr 0.05 --epochs 2 --seed 3)
    "$V" "${moco[@]}" --lr 1e-30 --max-steps 1 --output "$tmp/moco0" >/dev/null
    "$V" "${moco[@]}" --output "$tmp/moco-cpu" >/dev/null
    "$V" "${moco[@]}" --device cuda --output "$tmp/moco-gpu" | tee "$tmp/moco-gpu.log"
    grep -q ', on cuda' <(grep '^pretraining' "$tmp/moco-gpu.log")
    "$V" diff "$tmp/moco-gpu/model_last.safetensors" "$tmp/moco-cpu/model_last.safetensors" \
        --base "$tmp/moco0/model_last.safetensors" --rtol 1e-3 --atol 0
    echo "GPU: MoCo v2, 4 steps: the CPU's weight change"
fi
# Two processes on this machine's GPU(s) (mpirun, where Open MPI is here):
# on one GPU they share it, so the gradients go through host memory (NCCL
# refuses two ranks on one GPU), with a note saying why; on several, NCCL.
# As in e2e_mpi.sh: a ViT (no BatchNorm) with half the batch on each of 2
# ranks must end where 1 process with the whole batch ends, its weight
# change within 1e-4 normwise (1e-5 on the CPU; the GPU adds in other
# orders between the two runs).
if ! command -v mpirun >/dev/null || [ ! -e "$build/libvisc_mpi.so" ]; then
    echo "# no Open MPI here: the multi-process GPU runs are left out"
    exit 0
fi
vit=(train --dataset fashion-mnist --data "$data" --model vit_femto_patch4_28 --epochs 1
     --batch-size 32 --max-steps 5 --seed 3 --no-progress --print-freq 1 --opt sgd --lr 0.01
     --device cuda)
"$V" "${vit[@]}" --lr 0 --max-steps 1 --output "$tmp/w0" >/dev/null
"$V" "${vit[@]}" --output "$tmp/vit-1" >/dev/null
mpirun --allow-run-as-root --oversubscribe -np 2 "$V" "${vit[@]}" --output "$tmp/vit-2" |
    tee "$tmp/vit-2.log"
grep -qE '2 processes x 16, mpi, GPU gradients (nccl|through host memory)' "$tmp/vit-2.log"
"$V" diff "$tmp/vit-2/model_last.safetensors" "$tmp/vit-1/model_last.safetensors" \
    --base "$tmp/w0/model_last.safetensors" --rtol 1e-4 --atol 0
echo "GPU, 2 processes x 16: the weights of 1 process x 32 ($(grep -o 'GPU gradients [a-z ]*' "$tmp/vit-2.log"))"
# SimCLR over the same 2 processes: the embeddings gathered and the
# candidates' gradients summed between the GPUs (NT-Xent on the device,
# src/gpu/layers.c), the projection head's BatchNorm synchronized
# (--sync-bn): 2 x 5 must end where 1 x 10 ends, as on the CPU
# (e2e_mpi.sh), within 1e-4 normwise as the ViT above.
if [ $have_data -eq 1 ]; then
    simclr=("${ssl[@]}" --method simclr --model vit_pico_patch4_28 --opt sgd --lr 0.05 --epochs 2
            --seed 3 --sync-bn --device cuda)
    "$V" "${simclr[@]}" --lr 1e-30 --max-steps 1 --output "$tmp/simclr0" >/dev/null
    "$V" "${simclr[@]}" --output "$tmp/simclr-1" >/dev/null
    mpirun --allow-run-as-root --oversubscribe -np 2 "$V" "${simclr[@]}" --output "$tmp/simclr-2" |
        tee "$tmp/simclr-2.log"
    grep -qE '2 processes x 5, mpi, GPU gradients (nccl|through host memory)' "$tmp/simclr-2.log"
    "$V" diff "$tmp/simclr-2/model_last.safetensors" "$tmp/simclr-1/model_last.safetensors" \
        --base "$tmp/simclr0/model_last.safetensors" --rtol 1e-4 --atol 0
    echo "GPU, SimCLR on 2 processes x 5: the weights of 1 process x 10 ($(grep -o 'GPU gradients [a-z ]*' "$tmp/simclr-2.log"))"
fi
