#!/usr/bin/env bash
# `visc eval knn|linear|finetune` end to end on a small CIFAR-10 JPEG
# ImageFolder (issue 5's evaluation half):
# - knn runs, prints k and t with its result (defaults 200 / 0.1, and
#   given values), and writes eval_knn.json with both;
# - linear: the saved model differs from the weights in the classifier
#   only (backbone and BatchNorm statistics bit-identical);
# - finetune (--reset-head): the backbone moves too; eval_finetune.json;
# - bad input: one line on stderr, exit status 1.
set -euo pipefail
V=${VISC:-build/visc}
source tests/lib.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export VISC_CACHE_DIR="$tmp/cache" OMP_WAIT_POLICY=passive

# 20 train / 10 test images of each CIFAR-10 class, ImageNet layout
cifar_subset "$tmp/data" 20 10
data=(--data "imagenet:$tmp/data" --model resnet14 --input-size 32 --crop-pct 1 --threads 2 --workers 2)
"$V" train "${data[@]}" --epochs 1 --batch-size 50 --print-freq 0 --no-progress \
    --output "$tmp/pre" >/dev/null
W="$tmp/pre/model_last.safetensors"

# kNN: defaults pinned in the output and the JSON
out=$("$V" eval knn "${data[@]}" --weights "$W" --output "$tmp/knn")
echo "$out"
grep -q "kNN k=200 t=0.1: .*top1 [0-9.]*% top5 [0-9.]*% (100 val / 200 bank images" <<<"$out"
grep -q '"k":200,"t":0.1,' "$tmp/knn/eval_knn.json"
grep -q '"knn_top1":' "$tmp/knn/eval_knn.json"
grep -q '"wall_time_s":' "$tmp/knn/eval_knn.json"
out=$("$V" eval knn "${data[@]}" --weights "$W" --k 7 --t=0.05 --output "$tmp/knn")
echo "$out"
grep -q "kNN k=7 t=0.05:" <<<"$out"
grep -q '"k":7,"t":0.05,' "$tmp/knn/eval_knn.json"
# the random-init baseline runs as well
out=$("$V" eval knn "${data[@]}" --random-weights --output "$tmp/knn0")
grep -q "kNN k=200 t=0.1" <<<"$out"

# two processes (when Open MPI and the plugin are there): each extracts a
# shard, the bank is all-reduced: the same result as one process
if command -v mpirun >/dev/null && [ -f "$(dirname "$V")/libvisc_mpi.so" ]; then
    one=$("$V" eval knn "${data[@]}" --weights "$W" --threads 1 --output "$tmp/k1")
    # no leak check under ASan: Open MPI's dlclose'd components (see e2e_mpi.sh)
    two=$(ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" timeout 120 \
        mpirun --allow-run-as-root --oversubscribe -np 2 "$V" eval knn "${data[@]}" \
        --weights "$W" --threads 1 --output "$tmp/k2")
    one=${one%%$'\n'*} two=${two%%$'\n'*}
    echo "2 processes: $two"
    [ "${one%%(*}" = "${two%%(*}" ]
fi

# linear probe: only the classifier may change
"$V" eval linear "${data[@]}" --weights "$W" --epochs 2 --batch-size 50 --scale 0.35,1 \
    --output "$tmp/lin" | tail -2
grep -q '"linear_top1":' "$tmp/lin/eval_linear.json"
grep -q '"best_epoch":[12],' "$tmp/lin/eval_linear.json"
diff_out=$("$V" diff "$W" "$tmp/lin/model_linear.safetensors" --rtol 0 --atol 0 || true)
echo "$diff_out" | tail -3
grep -q "2 differ beyond" <<<"$diff_out"
[ "$(grep -c '^differs: fc\.' <<<"$diff_out")" -eq 2 ]

# finetune: a fresh head, the backbone trains
"$V" eval finetune "${data[@]}" --weights "$W" --epochs 1 --batch-size 50 --scale 0.35,1 \
    --print-freq 0 --no-progress --output "$tmp/ft" | tail -2
grep -q '"finetune_top1":' "$tmp/ft/eval_finetune.json"
grep -q '"reset_head":1' "$tmp/ft/eval_finetune.json"
diff_out=$("$V" diff "$W" "$tmp/ft/model_last.safetensors" || true)
grep -q "differs: layer1.0.conv1.weight" <<<"$diff_out" ||
    grep -q "differs: conv1.weight" <<<"$diff_out"

# bad input: one line, exit status 1
fails=0
expect_error() { # expect_error PATTERN ARGS...
    local pattern=$1; shift
    local err rc
    err=$(timeout -k 10 60 "$V" "$@" 2>&1 >/dev/null); rc=$?
    if [ $rc -ne 1 ] || ! grep -q -- "$pattern" <<<"$err" || [ "$(wc -l <<<"$err")" -ne 1 ]; then
        echo "FAIL: visc $* -> exit $rc, stderr: $err (wanted one line matching '$pattern')"
        fails=$((fails + 1))
    else
        echo "ok: visc $* -> $err"
    fi
}
set +e
expect_error "expected knn, linear or finetune" eval
expect_error "unknown evaluation 'svm'" eval svm
expect_error "weights FILE is required" eval knn "${data[@]}"
expect_error "k: expected a positive integer, got '0'" eval knn --k 0 --weights "$W"
expect_error "t: expected a positive number, got 'hot'" eval knn --t hot --weights "$W"
expect_error "option '--k' needs a value" eval knn --weights "$W" --k
expect_error "unknown option '--bogus'" eval linear --bogus --weights "$W"
expect_error "cannot open" eval knn "${data[@]}" --weights "$tmp/missing.safetensors"
expect_error "not a checkpoint of model resnet20" eval knn "${data[@]}" --model resnet20 --weights "$W"
expect_error "config is not supported" eval knn --config x.ini --weights "$W"
expect_error "two-view pretraining recipe" eval linear --aug mocov2 --weights "$W"
set -e
[ "$fails" -eq 0 ]
