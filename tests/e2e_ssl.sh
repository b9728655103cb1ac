#!/usr/bin/env bash
# Self-supervised pretraining end to end (issue 5), small and fast (it also
# runs under the sanitizers and coverage); tests/long/ssl_learns.sh (make
# test-long) checks that pretraining learns something.
# - MoCo v2: pretrains, logs the online classifier per epoch, its model file
#   is the query encoder that `visc eval` reads;
# - resume: stopped mid-epoch and resumed, the checkpoint (query and key
#   encoders, heads, optimizer state, memory bank) equals the
#   uninterrupted run's bit for bit;
# - SimCLR (LARS, NT-Xent, BatchNorm in the head) runs;
# - `visc bench-ssl` chains pretraining -> kNN -> linear -> finetune and
#   writes its table and JSON summary with every metric;
# - bad input: one line, status 1.
set -euo pipefail
V=${VISC:-build/visc}
source tests/lib.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export VISC_CACHE_DIR="$tmp/cache"
fail() { echo "FAIL: $*"; exit 1; }

# 20 train / 10 test images of each CIFAR-10 class
cifar_subset "$tmp/data" 20 10
common=(--data "imagenet:$tmp/data" --model resnet14 --width 16 --input-size 32 --crop-pct 1
        --batch-size 20 --bank-size 100 --seed 3 --no-progress --print-freq 0 --workers 2)

# --- MoCo v2 ---
"$V" pretrain "${common[@]}" --epochs 3 --output "$tmp/moco" | tee "$tmp/moco.log" | tail -2
[ "$(grep -c '"val_online_cls_top1"' "$tmp/moco/log.jsonl")" -eq 3 ] || fail "online classifier log"
grep -q "bank 100, momentum 0.999" "$tmp/moco.log" || fail "settings line"
"$V" eval knn --weights "$tmp/moco/model_last.safetensors" --model resnet14 --width 16 \
    --data "imagenet:$tmp/data" --input-size 32 --crop-pct 1 --batch-size 50 \
    --output "$tmp/moco" >"$tmp/knn.log" 2>&1 || { cat "$tmp/knn.log"; fail "kNN run"; }
grep -q "kNN k=200 t=0.1" "$tmp/knn.log" || { cat "$tmp/knn.log"; fail "kNN of the query encoder"; }

# --- resume mid-epoch 2 (10 steps per epoch), bit-exact ---
"$V" pretrain "${common[@]}" --epochs 3 --max-steps 13 --output "$tmp/part" >/dev/null
"$V" pretrain "${common[@]}" --epochs 3 --resume "$tmp/part/checkpoint_last.safetensors" \
    --output "$tmp/part" >"$tmp/resume.log"
grep -q "resumed from" "$tmp/resume.log" || fail "no resume"
"$V" diff "$tmp/part/checkpoint_last.safetensors" "$tmp/moco/checkpoint_last.safetensors" \
    --rtol 0 --atol 0 | tail -1
# a fresh key head (the reference library's choice) is another run
"$V" pretrain "${common[@]}" --epochs 1 --max-steps 2 --fresh-key-head --output "$tmp/fresh" \
    >/dev/null
"$V" pretrain "${common[@]}" --epochs 1 --max-steps 2 --momentum-cosine --output "$tmp/cos" \
    >/dev/null

# symmetric loss: both views' keys enter the bank once per step (2 x 20 per
# step: the pointer is at 80 after 2 steps; asymmetric: 40)
"$V" pretrain "${common[@]}" --epochs 1 --max-steps 2 --symmetric --output "$tmp/sym" >/dev/null
grep -aq 'bank_ptr\\":80,' "$tmp/sym/checkpoint_last.safetensors" || fail "symmetric enqueue"
grep -aq 'bank_ptr\\":40,' "$tmp/cos/checkpoint_last.safetensors" || fail "asymmetric enqueue"
grep -q '"symmetric":1' "$tmp/sym/log.jsonl" || fail "symmetric in the config"

# --- SimCLR ---
"$V" pretrain "${common[@]}" --method simclr --epochs 1 --output "$tmp/simclr" | tail -1
grep -q '"val_online_cls_top1"' "$tmp/simclr/log.jsonl" || fail "SimCLR online classifier"
grep -q '"opt":"lars"' "$tmp/simclr/log.jsonl" || fail "SimCLR uses LARS"

# --- the whole chain ---
"$V" bench-ssl "${common[@]}" --epochs 1 --linear-epochs 1 --finetune-epochs 1 \
    --eval-batch-size 50 --output "$tmp/bench" >"$tmp/bench.log"
tail -6 "$tmp/bench.log"
grep -q "^| mocov2 | [0-9.]* / [0-9.]* | [0-9.]* / [0-9.]* | [0-9.]* / [0-9.]* | [0-9.]* / [0-9.]* |$" \
    "$tmp/bench/results.md" || fail "results table incomplete"
for key in online_top1 knn_top1 knn_top5 linear_top1 linear_top5 finetune_top1 finetune_top5; do
    grep -q "\"$key\":[0-9]" "$tmp/bench/results.json" || fail "results.json lacks $key"
done

# --- bad input ---
expect_error() { # pattern command...
    local pattern=$1 status=0
    shift
    "$@" >"$tmp/out" 2>"$tmp/err" || status=$?
    [ $status -eq 1 ] || fail "status $status for: $*"
    [ "$(wc -l <"$tmp/err")" -eq 1 ] || { cat "$tmp/err"; fail "not one line: $*"; }
    grep -q "$pattern" "$tmp/err" || { cat "$tmp/err"; fail "no '$pattern' for: $*"; }
}
expect_error "needs image data" "$V" pretrain --dataset fashion-mnist --output "$tmp/e"
expect_error "expected mocov2 or simclr" "$V" pretrain "${common[@]}" --method byol
expect_error "pretraining needs two" "$V" pretrain "${common[@]}" --aug torchvision --output "$tmp/e"
expect_error "option of .visc pretrain." "$V" train --method mocov2
expect_error "expected mocov2_resnet50_imagenet" "$V" pretrain --preset imagenet
expect_error "not a visc pretraining checkpoint" "$V" pretrain "${common[@]}" \
    --resume "$tmp/bench/eval/checkpoint_last.safetensors" --output "$tmp/e"
expect_error "a mocov2 checkpoint, but the method is simclr" "$V" pretrain "${common[@]}" \
    --method simclr --resume "$tmp/moco/checkpoint_last.safetensors" --output "$tmp/e"
expect_error "expected a list of knn, linear, finetune" "$V" bench-ssl "${common[@]}" --eval svm
echo "ssl: all checks passed"
