#!/usr/bin/env bash
# Input pipeline throughput, ours against torchvision + PIL, in one run:
# decode + RandomResizedCrop(224) + flip + normalize over the 1,000
# ImageNet sample JPEGs (original sizes):
#   torchvision + PIL, one process (no DataLoader workers)
#   ours, plain folder: 1 thread exact (torchvision's pixels), 1 thread
#     --fast-decode, 2 threads exact and fast
#   ours, a pack resized to shorter side 256 (JPEG, and raw pixels): 1 and
#     2 threads, also as ratios to the plain folder
#   the two-view MoCo v2 recipe: torchvision vs ours 1 and 2 threads
# Each line gives images/s (wall clock) and images per CPU-second (user +
# sys time of the timed loop, all threads; less sensitive to other load on
# the machine than the wall clock);
# ratios are per core: ours at 1 thread / torchvision's single process.
# EPOCHS (default 2) passes over the files per run; the load average is
# printed before and after. Not a test: numbers depend on the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-../shared/data/imagenet-samples}
PY=${PY:-/usr/bin/python3}
EPOCHS=${EPOCHS:-2}
export OMP_WAIT_POLICY=passive
make -s -j2 build/bench/bench_pipeline build/visc
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export VISC_CACHE_DIR="$tmp/cache"
build/visc pack "flat:$DATA" "$tmp/pack256" --shorter-side 256 --quiet
build/visc pack "flat:$DATA" "$tmp/raw256" --shorter-side 256 --raw --quiet
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

# run CMD...: prints "<wall images/s> <images per CPU-second>"
run() {
    local line
    line=$("$@")
    echo "$line" >&2
    sed -n 's/.* \([0-9.]*\) per CPU-s \([0-9.]*\) images\/s$/\2 \1/p' <<<"$line"
}
B=build/bench/bench_pipeline
F="flat:$DATA"
tv=$(run "$PY" bench/torchvision_pipeline.py "$DATA" torchvision "$EPOCHS")
e1=$(run $B "$F" --threads 1 --epochs "$EPOCHS")
f1=$(run $B "$F" --threads 1 --epochs "$EPOCHS" --fast-decode 1)
e2=$(run $B "$F" --threads 2 --epochs "$EPOCHS")
f2=$(run $B "$F" --threads 2 --epochs "$EPOCHS" --fast-decode 1)
p1=$(run $B "pack:$tmp/pack256" --threads 1 --epochs "$EPOCHS")
p2=$(run $B "pack:$tmp/pack256" --threads 2 --epochs "$EPOCHS")
r1=$(run $B "pack:$tmp/raw256" --threads 1 --epochs "$EPOCHS")
r2=$(run $B "pack:$tmp/raw256" --threads 2 --epochs "$EPOCHS")
tvm=$(run "$PY" bench/torchvision_pipeline.py "$DATA" mocov2 "$EPOCHS")
m1=$(run $B "$F" --threads 1 --recipe mocov2 --epochs "$EPOCHS")
m2=$(run $B "$F" --threads 2 --recipe mocov2 --epochs "$EPOCHS")
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

# line LABEL "WALL CPU" "TVWALL TVCPU"
line() {
    awk -v l="$1" -v a="$2" -v b="$3" 'BEGIN {
        split(a, x, " "); split(b, t, " ");
        printf "  %-26s %6.0f images/s (%5.2fx)   %6.0f per CPU-s (%5.2fx)\n",
               l, x[1], x[1] / t[1], x[2], x[2] / t[2] }'
}
echo
echo "decode + RandomResizedCrop(224) + flip + normalize, $(nproc) cores," \
    "load average now $(cut -d' ' -f1-3 /proc/loadavg); ratios vs torchvision"
line "torchvision + PIL, 1 proc" "$tv" "$tv"
line "ours folder, 1 thread" "$e1" "$tv"
line "ours folder, 1 thread fast" "$f1" "$tv"
line "ours folder, 2 threads" "$e2" "$tv"
line "ours folder, 2 threads fast" "$f2" "$tv"
line "ours pack256, 1 thread" "$p1" "$tv"
line "ours pack256, 2 threads" "$p2" "$tv"
line "ours raw pack256, 1 thread" "$r1" "$tv"
line "ours raw pack256, 2 threads" "$r2" "$tv"
echo "packs against the plain folder (1 thread exact)"
line "pack256 (JPEG), 1 thread" "$p1" "$e1"
line "raw pack256, 1 thread" "$r1" "$e1"
awk -v a="$e1" -v b="$e2" 'BEGIN { split(a, x, " "); split(b, y, " ");
    printf "  scaling 1 -> 2 threads (exact, wall): %.2fx\n", y[1] / x[1] }'
echo "MoCo v2, two views per sample (samples/s)"
line "torchvision + PIL, 1 proc" "$tvm" "$tvm"
line "ours folder, 1 thread" "$m1" "$tvm"
line "ours folder, 2 threads" "$m2" "$tvm"
