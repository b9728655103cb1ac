#!/usr/bin/env bash
# Training from image files end to end (issue 4's "done when"):
# - an ImageNet-layout folder (train/, test/ of the CIFAR-10 JPEG copy, a
#   subset) trains and learns: validation top-1 well above chance;
# - the same data packed with `visc pack` gives bit-identical training;
# - a folder with broken images: --on-bad-image skip trains, counts the
#   files and names them in log.jsonl; --on-bad-image error stops with the
#   file's name; resuming mid-epoch over the skipped files is bit-exact;
# - the ImageNet samples (flat <wnid>_<name>.JPEG, 1000 classes) at 224 px
#   with the timm recipe (RandAugment, random erasing, mixup/cutmix) run.
set -euo pipefail
V=${VISC:-build/visc}
source tests/lib.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export VISC_CACHE_DIR="$tmp/cache"

# A small ImageNet layout: 60 train / 20 test images of each CIFAR-10 class.
cifar_subset "$tmp/data" 60 20
common=(--model resnet14 --input-size 32 --crop-pct 1 --scale 0.35,1 --batch-size 50 --epochs 6
        --lr 0.1 --print-freq 0 --no-progress --threads 2 --workers 2)
"$V" train --data "imagenet:$tmp/data" "${common[@]}" --output "$tmp/folder" | tail -2
top1=$(sed -n 's/.*"type":"val".*"top1":\([0-9.]*\).*/\1/p' "$tmp/folder/log.jsonl" | sort -g | tail -1)
echo "best val top1 on 200 test images: $top1%"
awk -v t="$top1" 'BEGIN { exit !(t >= 25) }' # chance is 10%

# The same data packed: the same bytes reach the pipeline, so training is identical.
"$V" pack "$tmp/data/train" "$tmp/pack-train" --quiet
"$V" train --data "pack:$tmp/pack-train" --val-data "imagefolder:$tmp/data/test" "${common[@]}" \
    --epochs 1 --output "$tmp/packed" >/dev/null
"$V" train --data "imagenet:$tmp/data" "${common[@]}" --epochs 1 --output "$tmp/folder1" >/dev/null
cmp "$tmp/packed/model_last.safetensors" "$tmp/folder1/model_last.safetensors"
echo "pack and folder train identically"

# Broken files among the images: skipped, counted, named; or a clear error.
cp -r "$tmp/data" "$tmp/bad"
: >"$tmp/bad/train/cat/zero-bytes.jpg"
echo "not an image" >"$tmp/bad/train/dog/text.jpg"
ships=("$tmp/data/train/ship/"*.jpg)
head -c 300 "${ships[0]}" >"$tmp/bad/train/ship/truncated.jpg"
bad=(--data "imagenet:$tmp/bad" "${common[@]}" --epochs 2 --batch-size 32)
"$V" train "${bad[@]}" --output "$tmp/skip" 2>"$tmp/skip.err" >/dev/null
cat "$tmp/skip.err"
grep -q "skipped 3 unusable images" "$tmp/skip.err"
for f in cat/zero-bytes.jpg dog/text.jpg ship/truncated.jpg; do grep -q "\"type\":\"bad_image\".*$f" "$tmp/skip/log.jsonl"; done
if "$V" train "${bad[@]}" --on-bad-image error --output "$tmp/err" >/dev/null 2>"$tmp/err.txt"; then
    echo "FAIL: --on-bad-image error trained over a broken file"; exit 1
fi
cat "$tmp/err.txt"
grep -Eq "zero-bytes.jpg|text.jpg|truncated.jpg" "$tmp/err.txt"
[ "$(wc -l <"$tmp/err.txt")" -eq 1 ]
# Resume mid-epoch 2 (past skipped files) continues bit-exactly.
"$V" train "${bad[@]}" --max-steps 27 --output "$tmp/straight" >/dev/null 2>&1
"$V" train "${bad[@]}" --max-steps 20 --output "$tmp/resumed" >/dev/null 2>&1
"$V" train "${bad[@]}" --max-steps 27 --output "$tmp/resumed" \
    --resume "$tmp/resumed/checkpoint_last.safetensors" >/dev/null 2>&1
cmp "$tmp/straight/checkpoint_last.safetensors" "$tmp/resumed/checkpoint_last.safetensors"
echo "resume over skipped images: bit-exact"

# The ImageNet samples: flat layout, 1000 classes, 224 px, the timm recipe.
out=$("$V" train --data "flat:$shared/imagenet-samples" --model resnet18 --aug timm \
    --mixup 0.8 --cutmix 1.0 --smoothing 0.1 --batch-size 16 --epochs 1 --max-steps 3 \
    --opt adamw --lr 0.001 --print-freq 1 --no-progress --threads 2 --output "$tmp/inet" 2>&1)
echo "$out" | tail -3
grep -q "1000 train" <<<"$out"
grep -q '"type":"train","epoch":1,"step":3' "$tmp/inet/log.jsonl"
