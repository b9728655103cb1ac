#!/usr/bin/env bash
# Resume is bit-exact: 24 steps in one run == 12 steps, stop, resume, 12 more
# (interrupted mid-epoch, so the data position is restored too). Also checks
# that evaluating the saved model reproduces itself and that the EMA and the
# optimizer state travel through the checkpoint (AdamW has two slots).
set -euo pipefail
V=${VISC:-build/visc}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
common=(--model resnet14 --epochs 2 --batch-size 32 --print-freq 0 --no-progress --threads 2)
for opt in sgd adamw; do
    extra=(--opt "$opt")
    [ "$opt" = adamw ] && extra+=(--lr 0.002 --wd 0.05 --model-ema-decay 0.99 --clip-grad 1.0)
    "$V" train "${common[@]}" "${extra[@]}" --max-steps 24 --output "$tmp/straight-$opt" >/dev/null
    "$V" train "${common[@]}" "${extra[@]}" --max-steps 12 --output "$tmp/resumed-$opt" >/dev/null
    "$V" train "${common[@]}" "${extra[@]}" --max-steps 24 --output "$tmp/resumed-$opt" \
        --resume "$tmp/resumed-$opt/checkpoint_last.safetensors" >/dev/null
    cmp "$tmp/straight-$opt/checkpoint_last.safetensors" "$tmp/resumed-$opt/checkpoint_last.safetensors"
    cmp "$tmp/straight-$opt/model_last.safetensors" "$tmp/resumed-$opt/model_last.safetensors"
    echo "resume with $opt: bit-exact"
done
# A different seed gives a different model (the comparison above can fail).
"$V" train "${common[@]}" --max-steps 12 --seed 1 --output "$tmp/seed1" >/dev/null
if cmp -s "$tmp/seed1/model_last.safetensors" "$tmp/resumed-sgd/model_last.safetensors"; then
    echo "another seed gave the same model" >&2; exit 1
fi
# --evaluate on the saved model runs and reports the test set.
out=$("$V" train --model resnet14 --weights "$tmp/straight-sgd/model_last.safetensors" --evaluate --batch-size 500)
echo "$out"
grep -q "10000 images" <<<"$out"
