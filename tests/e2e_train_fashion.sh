#!/usr/bin/env bash
# End to end: the default recipe (configs/fashion_mnist.ini) shortened to 4
# epochs must reach at least 90% test accuracy on Fashion-MNIST (PyTorch's
# 4-epoch run of the same model and recipe reaches 90.8%,
# ../shared/reference/anchors.md). Also checks what the run leaves behind:
# the model loads back, the TensorBoard file holds the validation curve, and
# the JSON log is complete.
set -euo pipefail
V=${VISC:-build/visc}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$V" train --config configs/fashion_mnist.ini --epochs 4 --warmup-epochs 1.2 --print-freq 0 \
    --no-progress --output "$tmp/run"
top1=$(grep '"type":"val"' "$tmp/run/log.jsonl" | tail -1 | sed 's/.*"top1":\([0-9.]*\).*/\1/')
echo "final test top-1: $top1%"
awk -v a="$top1" 'BEGIN { exit !(a >= 90.0) }' || { echo "FAIL: below 90%"; exit 1; }
[ "$(grep -c '"type":"val"' "$tmp/run/log.jsonl")" -eq 4 ]
grep -q '"type":"done"' "$tmp/run/log.jsonl"
ls "$tmp/run"/events.out.tfevents.* >/dev/null
[ "$(head -c 8 "$tmp/run/curves.png" | od -An -tx1 | tr -d ' ')" = 89504e470d0a1a0a ]  # a PNG
# the best model evaluates to the best accuracy logged
best=$(grep '"type":"done"' "$tmp/run/log.jsonl" | sed 's/.*"best_top1":\([0-9.]*\).*/\1/')
out=$("$V" train --config configs/fashion_mnist.ini --weights "$tmp/run/model_best.safetensors" --evaluate)
echo "$out"
awk -v a="$best" -v b="$(sed 's/.*top1 \([0-9.]*\)%.*/\1/' <<<"$out")" 'BEGIN { exit !(a - b < 0.005 && b - a < 0.005) }' \
    || { echo "FAIL: evaluating model_best gives a different accuracy than logged ($best)"; exit 1; }
