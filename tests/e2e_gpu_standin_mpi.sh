#!/usr/bin/env bash
# Several processes, each with its model on a GPU (`mpirun -np 2 visc train
# --device cuda`), on the stand-in GPU (tests/gpu/visc_standin, see
# e2e_gpu_standin.sh): the gradient buckets are averaged where they are
# (src/gpu/comm.c), both ways:
#   nccl  the stand-in's NCCL (tests/gpu/standin_nccl.c: the ranks reduce
#         through shared memory on a thread of their own, as NCCL's stream
#         beside the kernels; the optimizer's work waits for the join);
#   host  the process group's communication thread waits for each bucket,
#         downloads it into page-locked memory (the stand-in stops at any
#         other), the MPI backend reduces it, and it is uploaded again,
#         all while the main thread goes on with backward.
# The stand-in's kernels are the CPU's layers, and both reductions add two
# ranks' values as a + b, so 2 ranks on the stand-in must end exactly
# where the same 2 ranks end on the CPU (e2e_mpi.sh shows that those end
# where 1 process with the whole batch ends):
#   - a ResNet on image data (bytes on the bus), SGD with an EMA of the
#     weights, evaluated on the device every few steps (BatchNorm
#     statistics shared from rank 0 through host memory): the same model,
#     checkpoint, EMA and logged numbers, bit for bit; again with --sync-bn
#     (each BatchNorm's sums reduced over the ranks between its passes);
#   - a ViT with AdamW and --clip-grad, in 25 KB buckets (many buckets in
#     flight during backward) both ways, and in one bucket after backward
#     (--bucket-cap-mb 0): the CPU's bits;
#   - resume across devices: 3 steps on the CPU's 2 ranks and 3 on the
#     stand-in GPU's, and the other way, equal the 6 straight;
#   - `visc pretrain`: MoCo v2 (keys gathered from both ranks into the
#     bank, shuffle-BN of the key encoder over the key view's bytes) and
#     SimCLR (negatives from both ranks, gathered and their gradients
#     summed on the GPUs: NCCL, and through host memory; with --sync-bn):
#     the CPU's checkpoints, bit for bit;
#   - choosing: `auto` takes NCCL where each rank has its own GPU, the host
#     path with a note saying why where the ranks share one
#     (VISC_STANDIN_SHARED_GPU=1) or NCCL is absent (VISC_STANDIN_NO_NCCL=1);
#     `--gpu-allreduce nccl` is refused in one line there, as is a bad
#     --gpu-allreduce;
#   - a rank that hangs (SIGSTOP) makes the other give up within
#     --dist-timeout, with one line naming the all-reduce: the group's
#     timeout on the host path, the watchdog's on NCCL's.
set -euo pipefail
V=${VISC:-build/visc}
source tests/lib.sh
build=$(dirname "$V")
G=$build/tests/gpu/visc_standin
tmp=$(mktemp -d)
cleanup() {
    pkill -CONT -f "$tmp/" 2>/dev/null || true
    pkill -KILL -f "$tmp/" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT
export VISC_CACHE_DIR="$tmp/cache" OMP_WAIT_POLICY=passive
# visc_standin lives in build/tests/gpu/: the MPI plugin is in build/
export VISC_DIST_PLUGIN_DIR=$build
fail() { echo "FAIL: $*"; exit 1; }
logged() { grep -E '"type":"(train|val_step|val|val_ema)"' "$1" | sed -E 's/,"(img_per_s|time|epoch_time_s)":[0-9.]*//g'; }
# same NAME HOW ARGS...: 2 CPU ranks and 2 stand-in GPU ranks averaging
# their gradients HOW (nccl, host), the same files
same() {
    local name=$1 how=$2 line
    shift 2
    "${MPI[@]}" "$V" "$@" --output "$tmp/$name-cpu" >"$tmp/$name-cpu.log" 2>&1 ||
        { cat "$tmp/$name-cpu.log"; fail "$name: the CPU run failed"; }
    "${MPI[@]}" "$G" "$@" --device cuda --gpu-allreduce "$how" --output "$tmp/$name-gpu" \
        >"$tmp/$name-gpu.log" 2>&1 || { cat "$tmp/$name-gpu.log"; fail "$name: the stand-in GPU run failed"; }
    line="nccl"
    [ "$how" = host ] && line="through host memory"
    grep -q "2 processes x [0-9]*, mpi, GPU gradients $line" "$tmp/$name-gpu.log" ||
        fail "$name: no process line naming the GPU all-reduce ($line)"
    cmp <(tensors "$tmp/$name-cpu/checkpoint_last.safetensors") \
        <(tensors "$tmp/$name-gpu/checkpoint_last.safetensors") ||
        fail "$name: the checkpoints differ"
    diff <(logged "$tmp/$name-cpu/log.jsonl") <(logged "$tmp/$name-gpu/log.jsonl") ||
        fail "$name: the logged numbers differ"
}

cifar_subset "$tmp/data" 20 10
res=(train --data "imagenet:$tmp/data" --model resnet14 --width 16 --input-size 32 --crop-pct 1
     --workers 1 --threads 1 --epochs 2 --batch-size 20 --print-freq 2 --no-progress
     --eval-interval 5 --lr 0.05 --model-ema-decay 0.9 --max-steps 12)
same resnet nccl "${res[@]}"
grep -q "(batches as bytes)" "$tmp/resnet-gpu.log" || fail "image data did not cross as bytes"
grep -q '"type":"val_ema"' "$tmp/resnet-gpu/log.jsonl" || fail "no EMA evaluation logged"
echo "resnet14, 2 ranks on the stand-in GPU (NCCL), SGD + EMA, evaluated twice: the CPU ranks' checkpoint and logs, bit for bit"

# --sync-bn: every BatchNorm's sums reduced over the ranks between its
# passes (the device's sums come to the host and go back)
same resnet-syncbn host "${res[@]}" --sync-bn
! cmp -s "$tmp/resnet-gpu/model_last.safetensors" "$tmp/resnet-syncbn-gpu/model_last.safetensors" ||
    fail "--sync-bn changed nothing"
echo "the same with --sync-bn (through host memory): the CPU ranks' checkpoint and logs, bit for bit"

vit=(train --model vit_femto_patch4_28 --opt adamw --lr 0.002 --wd 0.05 --clip-grad 1 --epochs 1
     --batch-size 32 --print-freq 2 --no-progress --threads 1 --max-steps 6)
same vit-buckets nccl "${vit[@]}" --bucket-cap-mb 0.025
same vit-buckets-host host "${vit[@]}" --bucket-cap-mb 0.025
same vit-one-bucket nccl "${vit[@]}" --bucket-cap-mb 0
echo "vit_femto_patch4_28, 2 ranks, AdamW + clipping, 25 KB buckets both ways and one bucket: the CPU ranks', bit for bit"

# resume across devices, 2 ranks each: 3 steps on one, 3 on the other
# equal the 6 straight on the CPU
for first in cpu gpu; do
    [ $first = cpu ] && { A=$V; B=$G; dev_a=cpu; dev_b=cuda; } || { A=$G; B=$V; dev_a=cuda; dev_b=cpu; }
    "${MPI[@]}" "$A" "${vit[@]}" --bucket-cap-mb 0 --max-steps 3 --device $dev_a \
        --output "$tmp/x-$first" >/dev/null 2>&1 || fail "resume: the first half on $dev_a"
    "${MPI[@]}" "$B" "${vit[@]}" --bucket-cap-mb 0 --device $dev_b --output "$tmp/x-$first" \
        --resume "$tmp/x-$first/checkpoint_last.safetensors" >/dev/null 2>&1 ||
        fail "resume: the second half on $dev_b"
    cmp <(tensors "$tmp/vit-one-bucket-cpu/checkpoint_last.safetensors") \
        <(tensors "$tmp/x-$first/checkpoint_last.safetensors") ||
        fail "3 steps on $dev_a + 3 on $dev_b differ from 6 straight"
done
echo "2 ranks, 3 steps on the CPU then 3 on the stand-in GPU, and the other way: the 6 straight steps, bit for bit"

# self-supervised pretraining with 2 ranks
# (one epoch of 10 steps: the online classifier is evaluated at its end
# with rank 0's BatchNorm statistics, shared through host memory)
ssl=(pretrain --data "imagenet:$tmp/data" --model resnet14 --width 16 --input-size 32
     --crop-pct 1 --workers 1 --threads 1 --epochs 1 --batch-size 20 --print-freq 2
     --no-progress --lr 0.05 --seed 3)
same moco host "${ssl[@]}" --method mocov2 --bank-size 200
# shuffle-BN gathers and shuffles the key view as bytes
grep -q '(batches as bytes)$' <(grep '^pretraining' "$tmp/moco-gpu.log") ||
    fail "moco: the views did not cross as bytes"
# SimCLR's embeddings gathered on the GPUs and their gradients summed back
# there: NCCL's all-gather and all-reduce between the kernels, or through
# host memory over MPI
same simclr nccl "${ssl[@]}" --method simclr --sync-bn
same simclr-host host "${ssl[@]}" --method simclr
echo "MoCo v2 (gathered keys, shuffle-BN) and SimCLR (negatives gathered on the GPUs both ways, --sync-bn), 2 ranks: the CPU ranks' checkpoints and logs, bit for bit"

# choosing: auto takes NCCL where each rank has a GPU of its own (above),
# the host path where they share one or there is no NCCL, with a note
# (the reasons as extended regular expressions; a GPU is named host/device)
for why in "VISC_STANDIN_SHARED_GPU=1:ranks 0 and 1 share the GPU [^ ]*/stand-in:0, which NCCL refuses" \
           "VISC_STANDIN_NO_NCCL=1:the stand-in GPU has no NCCL \(VISC_STANDIN_NO_NCCL=1\)"; do
    setting=${why%%:*} reason=${why#*:}
    env "$setting" "${MPI[@]}" "$G" "${vit[@]}" --max-steps 2 --device cuda --output "$tmp/auto" \
        >"$tmp/auto.log" 2>&1 || { cat "$tmp/auto.log"; fail "auto with $setting failed"; }
    grep -qE "note: gradients are averaged through host memory: $reason" "$tmp/auto.log" ||
        { cat "$tmp/auto.log"; fail "auto with $setting: no note"; }
    grep -q "GPU gradients through host memory" "$tmp/auto.log" || fail "auto with $setting: not the host path"
    # refused in one line on every rank where NCCL cannot serve
    rc=0
    env "$setting" "${MPI[@]}" "$G" "${vit[@]}" --max-steps 1 --device cuda --gpu-allreduce nccl \
        --output "$tmp/refused" >/dev/null 2>"$tmp/refused.err" || rc=$?
    [ $rc -ne 0 ] || fail "--gpu-allreduce nccl with $setting was not refused"
    grep -qE -- "--gpu-allreduce nccl: $reason" "$tmp/refused.err" ||
        grep -qF -- "--gpu-allreduce nccl: another rank cannot use NCCL" "$tmp/refused.err" ||
        { cat "$tmp/refused.err"; fail "--gpu-allreduce nccl with $setting: no reason given"; }
done
rc=0
"${MPI[@]}" "$G" "${vit[@]}" --max-steps 1 --device cuda --gpu-allreduce gloo --output "$tmp/refused" \
    >/dev/null 2>"$tmp/refused.err" || rc=$?
[ $rc -ne 0 ] && grep -q -- "--gpu-allreduce: expected auto, nccl or host, got 'gloo'" "$tmp/refused.err" ||
    fail "a bad --gpu-allreduce was not refused"
echo "auto: the host path with a note where the ranks share a GPU or NCCL is absent; --gpu-allreduce nccl refused there, a bad --gpu-allreduce too"

# a rank that hangs: the other gives up after --dist-timeout (host: the
# group's wait for its collective; nccl: the watchdog, since the main
# thread is held in the join), in training (the gradients' all-reduce) and
# in SimCLR pretraining (first waiting in NT-Xent's all-gather)
for spec in host:train nccl:train host:simclr nccl:simclr; do
    how=${spec%%:*} job=${spec#*:}
    if [ "$job" = train ]; then
        args=("${vit[@]}" --max-steps 100000 --epochs 1)
    else
        args=("${ssl[@]}" --method simclr --epochs 1000)
    fi
    start=$(date +%s)
    "${MPI[@]}" "$G" "${args[@]}" --device cuda --dist-timeout 5 \
        --gpu-allreduce $how --output "$tmp/hang-$spec" >"$tmp/hang-$spec.log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do
        grep -q "^epoch 1/[0-9]* 2/" "$tmp/hang-$spec.log" 2>/dev/null && break
        sleep 0.2
    done
    rank1=$(rank1_of "$tmp/hang-$spec") || fail "rank 1 not found"
    kill -STOP "$rank1"
    rc=0
    wait $pid || rc=$?
    took=$(($(date +%s) - start))
    [ $rc -ne 0 ] || fail "$spec: the job ended well with a hung rank"
    [ $took -lt 60 ] || fail "$spec: the job took ${took}s to give up"
    grep -q "did not complete within 5 s: a peer process died or hangs" "$tmp/hang-$spec.log" ||
        { cat "$tmp/hang-$spec.log"; fail "$spec: no timeout message"; }
    echo "a hung rank ($how, $job): the job failed after ${took}s with '$(grep -o '[A-Za-z() -]* did not complete within 5 s' "$tmp/hang-$spec.log" | head -1)'"
done
