#!/usr/bin/env bash
# End to end: the default recipe (configs/fashion_mnist.ini), its one-cycle
# schedule shortened to EPOCHS epochs (30% warm-up, as the config), must
# reach the floor of that length on the Fashion-MNIST test set. Also checks
# what the run leaves behind: the model loads back, the TensorBoard file
# holds the validation curve, the JSON log is complete, the PNG is drawn.
#   EPOCHS=1  (make test)       over 2,000 images of each class (--subset
#             2000, a third of the set) >= 77%: measured 80.44% here
#             (2026-12-04, the AVX2 CI machine, 96 s; the whole set: 88.46%
#             in 261 s; a run is deterministic for a seed)
#   EPOCHS=4  (make test-long)  >= 90%: PyTorch's 4-epoch run of the same
#             model and recipe reaches 90.8% (../shared/reference/anchors.md);
#             ours 92.2-92.4%
#   EPOCHS=12 (make test-long)  >= 93%: the README's main job as it is (93.67%)
# make test runs the short form: the CI machine now has no AVX-512, and there
# the four epochs alone took 20 minutes (1,219 s), a quarter of CI's limit.
set -euo pipefail
V=${VISC:-build/visc}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
EPOCHS=${EPOCHS:-1}
subset=()
case $EPOCHS in
    1) floor=77 subset=(--subset 2000);; 4) floor=90;; 12) floor=93;;
    *) echo "e2e_train_fashion: EPOCHS=$EPOCHS has no floor (1, 4 or 12)"; exit 2;;
esac
"$V" train --config configs/fashion_mnist.ini --epochs "$EPOCHS" "${subset[@]}" \
    --warmup-epochs "$(awk -v e="$EPOCHS" 'BEGIN { print 0.3 * e }')" --print-freq 0 \
    --no-progress --output "$tmp/run"
top1=$(grep '"type":"val"' "$tmp/run/log.jsonl" | tail -1 | sed 's/.*"top1":\([0-9.]*\).*/\1/')
echo "final test top-1 after $EPOCHS epochs: $top1% (needs >= $floor%)"
awk -v a="$top1" -v f="$floor" 'BEGIN { exit !(a >= f) }' || { echo "FAIL: below $floor%"; exit 1; }
[ "$(grep -c '"type":"val"' "$tmp/run/log.jsonl")" -eq "$EPOCHS" ]
grep -q '"type":"done"' "$tmp/run/log.jsonl"
ls "$tmp/run"/events.out.tfevents.* >/dev/null
[ "$(head -c 8 "$tmp/run/curves.png" | od -An -tx1 | tr -d ' ')" = 89504e470d0a1a0a ]  # a PNG
# the best model evaluates to the best accuracy logged
best=$(grep '"type":"done"' "$tmp/run/log.jsonl" | sed 's/.*"best_top1":\([0-9.]*\).*/\1/')
out=$("$V" train --config configs/fashion_mnist.ini --weights "$tmp/run/model_best.safetensors" --evaluate)
echo "$out"
awk -v a="$best" -v b="$(sed 's/.*top1 \([0-9.]*\)%.*/\1/' <<<"$out")" 'BEGIN { exit !(a - b < 0.005 && b - a < 0.005) }' \
    || { echo "FAIL: evaluating model_best gives a different accuracy than logged ($best)"; exit 1; }
