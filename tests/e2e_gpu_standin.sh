#!/usr/bin/env bash
# `visc train --device cuda` end to end on the stand-in GPU
# (tests/gpu/visc_standin: visc with cuda.h's calls done by the CPU layers on
# host memory, tests/gpu/cpu_standin.c). CI has no GPU; this runs the GPU
# code path of the whole program: the model moved to the device, the batch
# uploaded (image data as bytes from page-locked memory, normalized on the
# device; the stand-in stops at any host pointer used as device memory, at
# page-locked memory left locked, and at an asynchronous copy's memory
# changed before the copy was waited for), the loss on the device, the optimizer's
# step and state on the device,
# checkpoints downloaded before each save, evaluation, resume. Since the
# stand-in's kernels are the CPU's layers, every result must be the CPU
# run's, bit for bit:
#   - 20 steps with SGD and with AdamW (with --clip-grad and an EMA of the
#     weights, evaluated on the device): the same model file, checkpoint,
#     EMA and logged losses as on the CPU (the GPU's kept on the device and
#     read back at each report); mixup and cutmix (soft targets crossing
#     beside the batch, their loss on the device): the same; a diverging
#     run: the CPU's message, naming the same step, and no checkpoint;
#     8 steps of LAMB and of LARS: the same checkpoint;
#   - the head dropout, not on the GPU yet, refused in one line, and so is
#     a device too small for the weights or for the activations' plan;
#   - a ViT (attention, LayerNorm, GELU, drop-path, class token), also with
#     --grad-checkpointing and with
#     --precision bf16 (the CPU's bf16 run), a Swin V2
#     (windows, masks, merging, cosine attention, the bias MLP) and CaiT
#     (talking heads, class attention, LayerScale): the same;
#   - resume across devices: 10 steps on the GPU + 10 on the CPU, and
#     10 on the CPU + 10 on the GPU, equal the 20 straight (model and
#     checkpoint with its optimizer state, the config's device aside);
#   - the GPU evaluates the saved model to the loss and accuracy the CPU
#     gets (also ending on a short batch);
#   - `visc pretrain --device cuda`: the views as bytes on the bus, each
#     normalized on the device into the encoder that reads it; MoCo v2 (the
#     momentum encoder updated and the InfoNCE against the bank's copy
#     taken on the device; also --symmetric, two backward passes) and
#     SimCLR (with SGD, and with its default LARS and --clip-grad), and
#     MoCo runs resumed on the other device, both ways: the CPU's checkpoint
#     (and the CPU's log: the losses and the online classifier's accuracy,
#     which come back from the device);
#   - `visc eval knn|linear --device cuda` (the backbone's features from
#     the device): the CPU's metrics and probe model, bit for bit; `visc
#     bench-ssl --device cuda` runs every phase there;
#   - the stand-in program's own model checks (test_gpu_standin).
# The ResNets train on 200 CIFAR-10 JPEGs and evaluate on 100 (the GPU path
# does not depend on the data; a small set keeps the sanitizer and
# coverage passes short). That a ResNet in bf16 on the stand-in GPU learns
# as the CPU's fp32 run does is e2e_gpu_standin_learns.sh.
set -euo pipefail
V=${VISC:-build/visc}
source tests/lib.sh
build=$(dirname "$V")
G=$build/tests/gpu/visc_standin
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# bf16 products on the CPU side too where the CPU has no avx512_bf16
# (otherwise it falls back to fp32, which the stand-in GPU does not).
export VISC_BF16_EMULATE=1

"$build/tests/gpu/test_gpu_standin" | tail -1 | grep -q '^[0-9]* passed, 0 failed$' ||
    { "$build/tests/gpu/test_gpu_standin" | grep FAIL; exit 1; }

# 20 train / 10 test images of each CIFAR-10 class
cifar_subset "$tmp/data" 20 10
export VISC_CACHE_DIR="$tmp/cache"
small=(--data "imagenet:$tmp/data" --model resnet14 --width 16 --input-size 32 --crop-pct 1
       --workers 2)
common=("${small[@]}" --epochs 2 --batch-size 20 --print-freq 0 --no-progress --threads 2
        --eval-interval 10)
# (each 5 steps a "train" record: the losses and top-1 counts the GPU kept
# on the device and read back in one run)
for opt in sgd adamw; do
    extra=(--opt "$opt" --print-freq 5)
    # AdamW with the timm recipe's gradient clipping and EMA of the weights
    [ "$opt" = adamw ] && extra+=(--lr 0.002 --wd 0.05 --clip-grad 0.5 --model-ema-decay 0.9)
    "$V" train "${common[@]}" "${extra[@]}" --max-steps 20 --output "$tmp/cpu-$opt" >/dev/null
    "$G" train "${common[@]}" "${extra[@]}" --max-steps 20 --output "$tmp/gpu-$opt" --device cuda \
        >"$tmp/gpu-$opt.log"
    # image data without mixing: the batches cross as bytes, normalized on the GPU
    grep -q ', on cuda (batches as bytes)$' <(grep '^training' "$tmp/gpu-$opt.log")
    # the stand-in's "device" memory is host memory: nothing held, but its
    # buffers (weights, state, arena) counted as PyTorch counts its own
    grep -q '^GPU memory: [0-9]* MiB held by this run (.*; [1-9][0-9]* MiB of buffers at most' \
        "$tmp/gpu-$opt.log"
    cmp "$tmp/cpu-$opt/model_last.safetensors" "$tmp/gpu-$opt/model_last.safetensors"
    # the same validation accuracy logged at step 10 and at the stop
    val() { grep '"val_step"' "$1" | sed 's/,"time":[0-9.]*//'; }
    diff <(val "$tmp/cpu-$opt/log.jsonl") <(val "$tmp/gpu-$opt/log.jsonl")
    train() { grep '"type":"train"' "$1" | sed -E 's/,"(img_per_s|time)":[0-9.]*//g'; }
    [ "$(train "$tmp/gpu-$opt/log.jsonl" | wc -l)" -eq 4 ]
    diff <(train "$tmp/cpu-$opt/log.jsonl") <(train "$tmp/gpu-$opt/log.jsonl")
    cmp <(tensors "$tmp/cpu-$opt/checkpoint_last.safetensors") \
        <(tensors "$tmp/gpu-$opt/checkpoint_last.safetensors")
    grep -qF '\"device\":\"cuda\"' "$tmp/gpu-$opt/checkpoint_last.safetensors"
    echo "20 steps with $opt ${extra[*]:4} on the stand-in GPU: the CPU's model, optimizer state, EMA and logged losses, bit for bit"
done
# mixup and cutmix: the batch crosses as floats (mixed on the host), the
# soft targets beside it, the soft-target loss on the device
mix=("${common[@]}" --mixup 0.8 --cutmix 1.0 --smoothing 0.1 --print-freq 5 --max-steps 10)
"$V" train "${mix[@]}" --output "$tmp/mix-cpu" >/dev/null
"$G" train "${mix[@]}" --device cuda --output "$tmp/mix-gpu" >"$tmp/mix-gpu.log"
if grep -q 'batches as bytes' "$tmp/mix-gpu.log"; then
    echo "mixed batches crossed the bus as bytes" >&2; exit 1
fi
cmp "$tmp/mix-cpu/model_last.safetensors" "$tmp/mix-gpu/model_last.safetensors"
diff <(train "$tmp/mix-cpu/log.jsonl") <(train "$tmp/mix-gpu/log.jsonl")
echo "10 steps with mixup and cutmix on the stand-in GPU: the CPU's model and logged losses, bit for bit"
# A diverging run: the GPU reads its losses back only at the epoch's end
# here (no reports), and still names the step the CPU names, and saves
# nothing.
boom=("${small[@]}" --epochs 1 --batch-size 20 --lr 1e8 --print-freq 0 --no-progress --threads 2)
for side in cpu gpu; do
    rc=0
    if [ $side = cpu ]; then "$V" train "${boom[@]}" --output "$tmp/boom-$side" >/dev/null 2>"$tmp/boom-$side.err" || rc=$?
    else "$G" train "${boom[@]}" --device cuda --output "$tmp/boom-$side" >/dev/null 2>"$tmp/boom-$side.err" || rc=$?; fi
    [ $rc -ne 0 ] && [ ! -e "$tmp/boom-$side/checkpoint_last.safetensors" ]
done
grep -qE '^visc: loss is (NaN|infinite) at step [0-9]+ \(epoch 1\): training diverged' "$tmp/boom-cpu.err"
diff "$tmp/boom-cpu.err" "$tmp/boom-gpu.err"
echo "a diverging run on the stand-in GPU: stopped with the CPU's message ($(head -c 60 "$tmp/boom-gpu.err")...), nothing saved"
# LAMB and LARS (per-tensor trust ratios)
# (no evaluation: the checkpoint holds all there is to compare)
adaptive=(--model resnet14 --epochs 1 --batch-size 32 --print-freq 0 --no-progress --threads 2
          --lr 0.01 --max-steps 8)
for opt in lamb lars; do
    "$V" train "${adaptive[@]}" --opt $opt --output "$tmp/cpu-$opt" >/dev/null
    "$G" train "${adaptive[@]}" --opt $opt --output "$tmp/gpu-$opt" --device cuda >/dev/null
    cmp <(tensors "$tmp/cpu-$opt/checkpoint_last.safetensors") \
        <(tensors "$tmp/gpu-$opt/checkpoint_last.safetensors")
    echo "8 steps with $opt on the stand-in GPU: the CPU's checkpoint, bit for bit"
done
# what is not on the GPU yet is refused in one line: the head dropout
rc=0
"$G" train --model vit_femto_patch4_28 --drop 0.1 --max-steps 1 --no-progress --device cuda \
    --output "$tmp/refused" >/dev/null 2>"$tmp/refused.err" || rc=$?
[ $rc -ne 0 ] && [ "$(wc -l <"$tmp/refused.err")" -eq 1 ]
grep -q -- "--device cuda: --drop (the head dropout) is not on the GPU yet" "$tmp/refused.err"
# a device too small for the plan: one line with the sizes, no checkpoint
# (VISC_STANDIN_DEVICE_MEMORY: the stand-in's device that small)
for device in "8M:the activation arena: 51 MiB needed, 6 MiB free of 8 MiB (a smaller batch" \
    "1M:the weights, their gradients and buffers: 1 MiB needed"; do
    rc=0
    VISC_STANDIN_DEVICE_MEMORY=${device%%:*} "$G" train --model vit_femto_patch4_28 --batch-size 64 \
        --max-steps 1 --no-progress --device cuda --output "$tmp/tiny" >/dev/null 2>"$tmp/tiny.err" ||
        rc=$?
    [ $rc -eq 1 ] && [ "$(wc -l <"$tmp/tiny.err")" -eq 1 ] && [ ! -e "$tmp/tiny/checkpoint_last.safetensors" ]
    grep -q -- "^visc: not enough device memory for ${device#*:}" "$tmp/tiny.err"
done
echo "a device too small for the weights or the plan: one line with the sizes, no checkpoint"

# a ViT (fused attention, LayerNorm, GELU, drop-path drawn on the host, class token)
vit=(--model vit_femto_patch4_28 --opt adamw --lr 0.002 --wd 0.05 --drop-path 0.1 --epochs 1
     --batch-size 32 --print-freq 0 --no-progress --threads 2 --max-steps 12)
"$V" train "${vit[@]}" --output "$tmp/vit-cpu" >/dev/null
"$G" train "${vit[@]}" --output "$tmp/vit-gpu" --device cuda >/dev/null
cmp "$tmp/vit-cpu/model_last.safetensors" "$tmp/vit-gpu/model_last.safetensors"
cmp <(tensors "$tmp/vit-cpu/checkpoint_last.safetensors") \
    <(tensors "$tmp/vit-gpu/checkpoint_last.safetensors")
echo "12 steps of vit_femto_patch4_28 with drop-path on the stand-in GPU: the CPU's, bit for bit"
# --grad-checkpointing on the GPU: each block recomputed in backward (its
# drop-path drawn again), the same model as the CPU's run that kept them
"$G" train "${vit[@]}" --grad-checkpointing --output "$tmp/vit-gpu-ckpt" --device cuda >/dev/null
cmp "$tmp/vit-cpu/model_last.safetensors" "$tmp/vit-gpu-ckpt/model_last.safetensors"
echo "the same with --grad-checkpointing on the stand-in GPU: the CPU's, bit for bit"
# --precision bf16: the linear layers' products with bf16 operands, on the
# GPU as in the CPU's bf16 mode (and so different from the fp32 run). A GPU
# multiplies in bf16 whatever the host has; on a CPU without avx512_bf16 the
# CPU side takes oneDNN's emulated bf16 kernels (exported at the top).
"$V" train "${vit[@]}" --precision bf16 --output "$tmp/vit-bf16-cpu" >/dev/null 2>&1
"$G" train "${vit[@]}" --precision bf16 --output "$tmp/vit-bf16-gpu" --device cuda >/dev/null 2>&1
cmp "$tmp/vit-bf16-cpu/model_last.safetensors" "$tmp/vit-bf16-gpu/model_last.safetensors"
grep -q '"precision":"bf16","device":"cuda"' "$tmp/vit-bf16-gpu/log.jsonl"
if cmp -s "$tmp/vit-cpu/model_last.safetensors" "$tmp/vit-bf16-gpu/model_last.safetensors"; then
    echo "the bf16 run gave the fp32 run's model" >&2; exit 1
fi
echo "12 steps of vit_femto_patch4_28 in bf16 on the stand-in GPU: the CPU's bf16 run, bit for bit"
# Swin V2 (windows, shifts, patch merging, cosine attention, the bias MLP)
swin=(--model swinv2_micro_patch2_window4_32 --input-size 32 --opt adamw --lr 0.002 --wd 0.05
      --drop-path 0.1 --epochs 1 --batch-size 8 --print-freq 0 --no-progress --threads 2
      --max-steps 4)
"$V" train "${swin[@]}" --output "$tmp/swin-cpu" >/dev/null
"$G" train "${swin[@]}" --output "$tmp/swin-gpu" --device cuda >/dev/null
cmp "$tmp/swin-cpu/model_last.safetensors" "$tmp/swin-gpu/model_last.safetensors"
echo "4 steps of swinv2_micro_patch2_window4_32 on the stand-in GPU: the CPU's, bit for bit"
# Swin V1 (its first norm written to windowed order as the qkv projection's
# operand, and its backward from there), fp32 and bf16
swin1=(--model swin_micro_patch2_window4_32 --input-size 32 --opt adamw --lr 0.002 --wd 0.05
       --drop-path 0.1 --epochs 1 --batch-size 8 --print-freq 0 --no-progress --threads 2
       --max-steps 4)
for p in fp32 bf16; do
    "$V" train "${swin1[@]}" --precision $p --output "$tmp/swin1-$p-cpu" >/dev/null 2>&1
    "$G" train "${swin1[@]}" --precision $p --output "$tmp/swin1-$p-gpu" --device cuda >/dev/null 2>&1
    cmp "$tmp/swin1-$p-cpu/model_last.safetensors" "$tmp/swin1-$p-gpu/model_last.safetensors"
done
if cmp -s "$tmp/swin1-fp32-gpu/model_last.safetensors" "$tmp/swin1-bf16-gpu/model_last.safetensors"; then
    echo "Swin V1's bf16 run gave the fp32 run's model" >&2; exit 1
fi
echo "4 steps of swin_micro_patch2_window4_32 on the stand-in GPU, fp32 and bf16: the CPU's, bit for bit"
# CaiT (talking heads, class attention, LayerScale)
cait=(--model cait_xxs24_224 --input-size 32 --opt adamw --lr 0.001 --epochs 1 --batch-size 4
      --print-freq 0 --no-progress --threads 2 --max-steps 2)
"$V" train "${cait[@]}" --output "$tmp/cait-cpu" >/dev/null
"$G" train "${cait[@]}" --output "$tmp/cait-gpu" --device cuda >/dev/null
cmp "$tmp/cait-cpu/model_last.safetensors" "$tmp/cait-gpu/model_last.safetensors"
echo "2 steps of cait_xxs24_224 on the stand-in GPU: the CPU's, bit for bit"

# resume across devices
for first in cpu gpu; do
    [ $first = cpu ] && { A=$V; B=$G; dev_a=cpu; dev_b=cuda; } || { A=$G; B=$V; dev_a=cuda; dev_b=cpu; }
    "$A" train "${common[@]}" --max-steps 10 --device $dev_a --output "$tmp/x-$first" >/dev/null
    "$B" train "${common[@]}" --max-steps 20 --device $dev_b --output "$tmp/x-$first" \
        --resume "$tmp/x-$first/checkpoint_last.safetensors" >/dev/null
    cmp "$tmp/cpu-sgd/model_last.safetensors" "$tmp/x-$first/model_last.safetensors"
    cmp <(tensors "$tmp/cpu-sgd/checkpoint_last.safetensors") \
        <(tensors "$tmp/x-$first/checkpoint_last.safetensors")
    echo "10 steps on $dev_a, resumed for 10 on $dev_b: the 20 straight steps, bit for bit"
done

# evaluation on the GPU (bytes on the bus, loss and counts read back at the
# end, or every 64 batches: batch 1); batch 30 ends on a short batch, its
# padding counted nowhere
for eb in 50 30 1; do
    cpu=$("$V" train "${small[@]}" --weights "$tmp/cpu-sgd/model_last.safetensors" --evaluate \
        --batch-size $eb)
    gpu=$("$G" train "${small[@]}" --weights "$tmp/cpu-sgd/model_last.safetensors" --evaluate \
        --batch-size $eb --device cuda)
    echo "$gpu"
    [ "$cpu" = "$gpu" ]
done
# a stand-in run can also fail: another seed gives another model
"$G" train "${common[@]}" --max-steps 10 --seed 1 --device cuda --output "$tmp/seed1" >/dev/null
if cmp -s "$tmp/seed1/model_last.safetensors" "$tmp/x-gpu/model_last.safetensors"; then
    echo "another seed gave the same model" >&2; exit 1
fi

# --- pretraining ---
# a whole epoch (4 steps) with an EMA of the weights: the epoch's end
# evaluates the EMA on the device (its weights swapped in), as on the CPU
ema=(--data "imagenet:$tmp/data" --model resnet14 --width 16 --input-size 32 --crop-pct 1
     --batch-size 50 --epochs 1 --opt adamw --lr 0.002 --model-ema-decay 0.9 --no-progress
     --print-freq 0 --workers 2)
"$V" train "${ema[@]}" --output "$tmp/ema-cpu" >/dev/null
"$G" train "${ema[@]}" --device cuda --output "$tmp/ema-gpu" >/dev/null
grep -q '"val_ema"' "$tmp/ema-gpu/log.jsonl"
evals() { grep -E '"val_ema"|"val"' "$1" | sed -E 's/,"(time|epoch_time_s)":[0-9.]*//g'; }
diff <(evals "$tmp/ema-cpu/log.jsonl") <(evals "$tmp/ema-gpu/log.jsonl")
cmp <(tensors "$tmp/ema-cpu/checkpoint_last.safetensors") \
    <(tensors "$tmp/ema-gpu/checkpoint_last.safetensors")
echo "an epoch with an EMA of the weights on the stand-in GPU: the CPU's evaluations and checkpoint"
ssl=(--data "imagenet:$tmp/data" --model resnet14 --width 16 --input-size 32 --crop-pct 1
     --batch-size 20 --bank-size 100 --seed 3 --no-progress --print-freq 0 --workers 2 --epochs 2)
for run in "moco" "moco --symmetric" "simclr --opt sgd --lr 0.1" "simclr --clip-grad 1"; do
    read -r method extra <<<"$run"
    [ "$method" = moco ] && method=mocov2
    name=${run// /_}
    # shellcheck disable=SC2086 # the extra flags, words
    "$V" pretrain "${ssl[@]}" --method $method $extra --max-steps 12 --output "$tmp/p-cpu-$name" >/dev/null
    # shellcheck disable=SC2086
    "$G" pretrain "${ssl[@]}" --method $method $extra --max-steps 12 --device cuda \
        --output "$tmp/p-gpu-$name" >"$tmp/p-gpu-$name.log"
    # both views cross as bytes and are normalized on the device, each into
    # the encoder that reads it
    grep -q '(batches as bytes)$' <(grep '^pretraining' "$tmp/p-gpu-$name.log")
    cmp "$tmp/p-cpu-$name/model_last.safetensors" "$tmp/p-gpu-$name/model_last.safetensors"
    cmp <(tensors "$tmp/p-cpu-$name/checkpoint_last.safetensors") \
        <(tensors "$tmp/p-gpu-$name/checkpoint_last.safetensors")
    # the step's numbers, read back from the device (the contrastive loss,
    # the online classifier's loss and accuracy), and the online
    # classifier's validation: what the CPU logged
    [ "$(train "$tmp/p-gpu-$name/log.jsonl" | grep -c '"online_cls_loss"')" -eq 1 ]
    diff <(train "$tmp/p-cpu-$name/log.jsonl") <(train "$tmp/p-gpu-$name/log.jsonl")
    [ "$(evals "$tmp/p-gpu-$name/log.jsonl" | grep -c '"val_online_cls_top1"')" -eq 1 ]
    diff <(evals "$tmp/p-cpu-$name/log.jsonl") <(evals "$tmp/p-gpu-$name/log.jsonl")
    echo "pretrain $run, 12 steps on the stand-in GPU: the CPU's checkpoint and log, bit for bit"
done
# random erasing has no byte form: the views cross as floats, copied into
# each encoder's input on the device, the labels with them
for method in mocov2 simclr; do
    "$V" pretrain "${ssl[@]}" --method $method --reprob 0.25 --max-steps 12 \
        --output "$tmp/f-cpu-$method" >/dev/null
    "$G" pretrain "${ssl[@]}" --method $method --reprob 0.25 --max-steps 12 --device cuda \
        --output "$tmp/f-gpu-$method" >"$tmp/f-gpu-$method.log"
    if grep -q 'as bytes' <(grep '^pretraining' "$tmp/f-gpu-$method.log"); then
        echo "$method: float batches crossed the bus as bytes" >&2; exit 1
    fi
    cmp <(tensors "$tmp/f-cpu-$method/checkpoint_last.safetensors") \
        <(tensors "$tmp/f-gpu-$method/checkpoint_last.safetensors")
    diff <(train "$tmp/f-cpu-$method/log.jsonl") <(train "$tmp/f-gpu-$method/log.jsonl")
    echo "pretrain $method --reprob 0.25 (float batches), 12 steps on the stand-in GPU: the CPU's checkpoint and log, bit for bit"
done
# --precision bf16 with a transformer encoder (its linear layers and the
# heads' on the GPU; a ResNet's convolutions would differ)
vssl=(--model vit_pico_patch4_28 --opt adamw --lr 0.001 --max-steps 12 --precision bf16)
"$V" pretrain "${ssl[@]}" "${vssl[@]}" --output "$tmp/p-cpu-bf16" >/dev/null 2>&1
"$G" pretrain "${ssl[@]}" "${vssl[@]}" --device cuda --output "$tmp/p-gpu-bf16" >/dev/null 2>&1
cmp <(tensors "$tmp/p-cpu-bf16/checkpoint_last.safetensors") \
    <(tensors "$tmp/p-gpu-bf16/checkpoint_last.safetensors")
grep -q '"precision":"bf16","device":"cuda"' "$tmp/p-gpu-bf16/log.jsonl"
echo "pretrain moco vit_pico_patch4_28 --precision bf16, 12 steps on the stand-in GPU: the CPU's checkpoint, bit for bit"
"$G" pretrain "${ssl[@]}" --max-steps 7 --device cuda --output "$tmp/p-x" >/dev/null
"$V" pretrain "${ssl[@]}" --max-steps 12 --output "$tmp/p-x" \
    --resume "$tmp/p-x/checkpoint_last.safetensors" >/dev/null
cmp <(tensors "$tmp/p-cpu-moco/checkpoint_last.safetensors") <(tensors "$tmp/p-x/checkpoint_last.safetensors")
echo "pretrain moco, 7 steps on the stand-in GPU resumed for 5 on the CPU: the 12 straight, bit for bit"
# and the other way: the bank the CPU left (it wrapped: 7 x 20 keys in 100
# rows) goes to the GPU's copy with the checkpoint
"$V" pretrain "${ssl[@]}" --max-steps 7 --output "$tmp/p-y" >/dev/null
"$G" pretrain "${ssl[@]}" --max-steps 12 --device cuda --output "$tmp/p-y" \
    --resume "$tmp/p-y/checkpoint_last.safetensors" >/dev/null
cmp <(tensors "$tmp/p-cpu-moco/checkpoint_last.safetensors") <(tensors "$tmp/p-y/checkpoint_last.safetensors")
echo "pretrain moco, 7 steps on the CPU resumed for 5 on the stand-in GPU: the 12 straight, bit for bit"

# the SSL benchmark's evaluations with the backbone on the stand-in GPU:
# kNN (features extracted on the device) and the linear probe (the frozen
# backbone's features from the device, the head trained on the host): the
# CPU's metrics, and the probe's model file, bit for bit
W="$tmp/p-cpu-moco/model_last.safetensors"
ev=(--data "imagenet:$tmp/data" --model resnet14 --width 16 --input-size 32 --crop-pct 1
    --weights "$W" --threads 2 --workers 2 --batch-size 50)
metrics() { sed -E 's/.*"metrics":(\{[^}]*\}).*/\1/' "$1"; }
for e in knn linear; do
    extra=()
    [ $e = linear ] && extra=(--epochs 2 --scale 0.35,1)
    "$V" eval $e "${ev[@]}" "${extra[@]}" --output "$tmp/ev-$e-cpu" >/dev/null
    "$G" eval $e "${ev[@]}" "${extra[@]}" --device cuda --output "$tmp/ev-$e-gpu" >"$tmp/ev-$e-gpu.log"
    grep -q ' on cuda' "$tmp/ev-$e-gpu.log"
    grep -q '"device":"cuda"' "$tmp/ev-$e-gpu/eval_$e.json"
    [ "$(metrics "$tmp/ev-$e-cpu/eval_$e.json")" = "$(metrics "$tmp/ev-$e-gpu/eval_$e.json")" ]
    echo "eval $e with the backbone on the stand-in GPU: the CPU's $(metrics "$tmp/ev-$e-gpu/eval_$e.json")"
done
cmp "$tmp/ev-linear-cpu/model_linear.safetensors" "$tmp/ev-linear-gpu/model_linear.safetensors"
# the whole benchmark chain on the stand-in GPU: every phase there
"$G" bench-ssl --data "imagenet:$tmp/data" --model resnet14 --width 16 --input-size 32 --crop-pct 1 \
    --epochs 1 --batch-size 20 --bank-size 100 --eval knn,linear,finetune --linear-epochs 1 \
    --finetune-epochs 1 --eval-batch-size 50 --device cuda --no-progress --print-freq 0 \
    --threads 2 --workers 2 --output "$tmp/bench" >/dev/null
grep -q '^| mocov2 |' "$tmp/bench/results.md"
[ "$(grep -l '"device":"cuda"' "$tmp/bench/eval"/eval_*.json | wc -l)" -eq 3 ]
echo "bench-ssl --device cuda on the stand-in GPU: pretraining and kNN, linear, finetune all there"
