#!/usr/bin/env bash
# Bad input gets one clear line on stderr and exit status 1: never a crash
# (signals give 128+N), never a hang, never a half-written checkpoint.
set -uo pipefail
V=${VISC:-build/visc}
tmp=$(mktemp -d); trap 'umount "$tmp/full" 2>/dev/null; rm -rf "$tmp"' EXIT
fails=0
expect_error() { # expect_error PATTERN ARGS...
    local pattern=$1; shift
    local err rc
    err=$(timeout -k 10 120 "$V" "$@" 2>&1 >/dev/null); rc=$?
    if [ $rc -ne 1 ] || ! grep -q -- "$pattern" <<<"$err" || [ "$(wc -l <<<"$err")" -ne 1 ]; then
        echo "FAIL: visc $* -> exit $rc, stderr: $err (wanted one line matching '$pattern')"
        fails=$((fails + 1))
    else
        echo "ok: visc $* -> $err"
    fi
}
quick=(--model resnet14 --epochs 1 --batch-size 32 --print-freq 0 --no-progress)
"$V" train "${quick[@]}" --max-steps 2 --output "$tmp/good" >/dev/null || { echo "FAIL: a good run failed"; exit 1; }
good="$tmp/good/checkpoint_last.safetensors"

expect_error "unknown option '--bogus'" train --bogus
expect_error "lr: expected a number, got 'abc'" train --lr abc
expect_error "batch-size: expected an integer" train --batch-size 12x
expect_error "option '--epochs' needs a value" train --epochs
expect_error "unknown command" frobnicate
expect_error "log.jsonl: cannot read" plot "$tmp/nope"
expect_error "unknown option '--bogus'" plot --bogus
expect_error "unknown model 'vgg11'" train --model vgg11 --output "$tmp/x"
expect_error "unknown optimizer" train --opt sgdx --output "$tmp/x"
expect_error "unknown dataset" train --dataset imagenet22k --output "$tmp/x"
expect_error "cannot open" train --data "$tmp/missing" --output "$tmp/x"
expect_error "cannot open" train --config "$tmp/missing.ini"
printf 'epochs = 3\nthis line is wrong\n' >"$tmp/bad.ini"
expect_error "bad.ini:2" train --config "$tmp/bad.ini"
printf 'epochz = 3\n' >"$tmp/typo.ini"
expect_error "unknown key 'epochz'" train --config "$tmp/typo.ini"

# image data and transformer options
shared=../shared/data
[ -d "$shared" ] || shared=/work/shared/data
export VISC_CACHE_DIR="$tmp/cache"
mkdir -p "$tmp/imgs/a" "$tmp/imgs/b"
cp "$shared/cifar10/train/cat/0000.jpg" "$tmp/imgs/a/"
img=(--data "imagefolder:$tmp/imgs" --input-size 32 --epochs 1 --batch-size 1 --no-progress)
expect_error "class folder.*b" train "${img[@]}" --output "$tmp/x"
cp "$shared/cifar10/train/dog/0000.jpg" "$tmp/imgs/b/"
expect_error "cannot open '$tmp/nothing'" train --data "imagefolder:$tmp/nothing" --output "$tmp/x"
expect_error "unknown data set 'tar:x'" train --data tar:x --val-data tar:x --output "$tmp/x"
expect_error "on-bad-image: expected skip or error" train "${img[@]}" --on-bad-image maybe --output "$tmp/x"
expect_error "scale: expected two numbers" train "${img[@]}" --scale 0.5 --output "$tmp/x"
expect_error "rand-x" train "${img[@]}" --aa rand-x --output "$tmp/x"
expect_error "unknown recipe\|unknown preset\|recipe" train "${img[@]}" --aug fancy --output "$tmp/x"
expect_error "mixup: alphas must be >= 0" train "${quick[@]}" --mixup -1 --output "$tmp/x"
expect_error "swin_micro_patch2_window4_32" train --model swin_micro_patch2_window4_32 --epochs 1 --output "$tmp/x"
expect_error "input-size 20: cannot pad 28x28 images to 20 px" train "${quick[@]}" --input-size 20 --output "$tmp/x"

# truncated dataset files
mkdir -p "$tmp/fm"
for f in t10k-images-idx3-ubyte t10k-labels-idx1-ubyte train-labels-idx1-ubyte; do
    cp /usr/share/datasets/fashion-mnist/$f.gz "$tmp/fm/"
done
head -c 100000 /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz >"$tmp/fm/train-images-idx3-ubyte.gz"
expect_error "train-images-idx3-ubyte.gz" train --data "$tmp/fm" --output "$tmp/x"

# corrupt, truncated and foreign checkpoints
head -c 5000 "$good" >"$tmp/trunc.safetensors"
expect_error "trunc.safetensors" train "${quick[@]}" --resume "$tmp/trunc.safetensors" --output "$tmp/x"
printf 'not a checkpoint at all' >"$tmp/junk.safetensors"
expect_error "junk.safetensors" train "${quick[@]}" --resume "$tmp/junk.safetensors" --output "$tmp/x"
expect_error "checkpoint of model resnet14" train --model resnet20 --epochs 1 --resume "$good" --output "$tmp/x"
expect_error "optimizer sgd" train "${quick[@]}" --opt adamw --resume "$good" --output "$tmp/x"
expect_error "not a checkpoint of model resnet20: 30 missing (layer1.2.conv1.weight, layer1.2.bn1.weight, layer1.2.bn1.bias, layer1.2.conv2.weight, ...)" train --model resnet20 --weights "$tmp/good/model_last.safetensors" --evaluate
expect_error "shape" train "${quick[@]}" --width 8 --weights "$tmp/good/model_last.safetensors" --evaluate
expect_error "No such file" train "${quick[@]}" --resume "$tmp/none.safetensors" --output "$tmp/x"

# An output "folder" that is a file, and a checkpoint path that cannot be
# replaced (a directory is in the way): both fail cleanly, with no temporary
# file left behind and the files already there untouched.
touch "$tmp/afile"
expect_error "afile" train "${quick[@]}" --max-steps 1 --output "$tmp/afile"
mkdir -p "$tmp/blocked/checkpoint_last.safetensors"
cp "$tmp/good/model_last.safetensors" "$tmp/blocked/model_last.safetensors"
before=$(md5sum <"$tmp/blocked/model_last.safetensors")
expect_error "checkpoint_last.safetensors" train "${quick[@]}" --max-steps 1 --output "$tmp/blocked"
[ "$(md5sum <"$tmp/blocked/model_last.safetensors")" = "$before" ] || { echo "FAIL: model file changed"; fails=$((fails + 1)); }
if ls "$tmp/blocked" | grep -q tmp; then echo "FAIL: temporary file left behind"; fails=$((fails + 1)); fi

# A full disk (a 2 MiB tmpfs: the model file fits, the checkpoint with its
# optimizer state does not): one line naming the file and the cause, the
# model file already there untouched, no temporary file left behind.
mkdir -p "$tmp/full"
if ! mount -t tmpfs -o size=2m tmpfs "$tmp/full"; then
    echo "FAIL: cannot mount a tmpfs for the full-disk case (the tests run as root)"
    fails=$((fails + 1))
else
    cp "$tmp/good/model_last.safetensors" "$tmp/full/"
    before=$(md5sum <"$tmp/full/model_last.safetensors")
    expect_error "cannot write '$tmp/full/checkpoint_last.safetensors' (write failed): No space left on device" \
        train "${quick[@]}" --max-steps 1 --output "$tmp/full"
    [ "$(md5sum <"$tmp/full/model_last.safetensors")" = "$before" ] || { echo "FAIL: model file changed on a full disk"; fails=$((fails + 1)); }
    if ls "$tmp/full" | grep -q tmp; then echo "FAIL: temporary file left on a full disk"; fails=$((fails + 1)); fi
    umount "$tmp/full"
fi

# Plans larger than the memory there is: one line before anything is
# touched, where Linux's overcommit would let the allocation through and
# kill the process without a word once it is filled. VISC_MEMORY_LIMIT
# stands in for a small machine, so the case is the same on every runner.
big=(--data "flat:$shared/imagenet-samples" --img-size 224 --batch-size 64 --max-steps 1 --no-progress)
VISC_MEMORY_LIMIT=3G expect_error "not enough memory for the activation arena: [0-9]* MiB needed.*grad-checkpointing" \
    train --model resnet50 "${big[@]}" --output "$tmp/small-machine"
[ ! -e "$tmp/small-machine/checkpoint_last.safetensors" ] || { echo "FAIL: a refused run wrote a checkpoint"; fails=$((fails + 1)); }
VISC_MEMORY_LIMIT=3G expect_error "not enough memory for the activation arena" \
    pretrain --model resnet50 "${big[@]}" --output "$tmp/small-machine-ssl"
VISC_MEMORY_LIMIT=3x expect_error "VISC_MEMORY_LIMIT='3x': expected a size" train --model resnet50 "${big[@]}" --output "$tmp/x"

echo "$fails failures"
[ $fails -eq 0 ]
