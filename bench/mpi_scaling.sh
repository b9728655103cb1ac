#!/usr/bin/env bash
# mpi_scaling.sh: data-parallel scaling from 1 to 2 processes on this machine.
#
# ResNet-18 at 32 px (torchvision's stem, as in bench/train_vs_pytorch.sh;
# Fashion-MNIST zero-padded to 32, in memory, so data loading costs
# nothing), global batch 128, 1 compute thread per process:
#   1 process  x batch 128
#   2 processes x batch 64 (mpirun), gradients all-reduced in 25 MB buckets
#     during backward (default), and in one all-reduce after backward
#     (--bucket-cap-mb 0)
# Prints images/s (the trainer's own window rate over the last steps),
# scaling efficiency (2-process rate / (2 x 1-process rate)) and the share
# of rank 0's step time spent waiting for collectives (what the overlap did
# not hide; the trainer's "communication:" line). Runs alternate so load
# changes hit all alike; medians of REPEATS (default 3). Not a test.
# usage: bench/mpi_scaling.sh [STEPS (default 40)]
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-40}
REPEATS=${REPEATS:-3}
make -s -j2 all
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=passive
common=(--model resnet18 --input-size 32 --batch-size 128 --epochs 1
        --max-steps "$STEPS" --print-freq "$STEPS" --no-progress --threads 1 --workers 1)
MPI=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2)
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
rate() { sed -n 's/.* \([0-9.]*\) img\/s .*/\1/p' "$1" | tail -1; }
comm() { sed -n 's/.*(\([0-9.]*\)% of the run).*/\1/p' "$1"; }
for r in $(seq "$REPEATS"); do
    build/visc train "${common[@]}" --output "$tmp/one" >"$tmp/one.log"
    "${MPI[@]}" build/visc train "${common[@]}" --output "$tmp/two" >"$tmp/two.log"
    "${MPI[@]}" build/visc train "${common[@]}" --bucket-cap-mb 0 --output "$tmp/flat" \
        >"$tmp/flat.log"
    printf '%s %s %s %s %s\n' "$(rate "$tmp/one.log")" "$(rate "$tmp/two.log")" \
        "$(comm "$tmp/two.log")" "$(rate "$tmp/flat.log")" "$(comm "$tmp/flat.log")" |
        tee -a "$tmp/runs" >&2
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
col() { awk -v c="$1" '{ print $c }' "$tmp/runs" | median; }
one=$(col 1) two=$(col 2) twoc=$(col 3) flat=$(col 4) flatc=$(col 5)
echo
echo "ResNet-18, 32 px, global batch 128, 1 thread per process, $STEPS steps, medians of $REPEATS:"
printf '  %-44s %7.0f img/s\n' "1 process" "$one"
printf '  %-44s %7.0f img/s  efficiency %3.0f%%  waiting %4.1f%% of the run\n' \
    "2 processes, bucketed all-reduce in backward" "$two" "$(echo "100 * $two / (2 * $one)" | bc -l)" "$twoc"
printf '  %-44s %7.0f img/s  efficiency %3.0f%%  waiting %4.1f%% of the run\n' \
    "2 processes, one all-reduce after backward" "$flat" "$(echo "100 * $flat / (2 * $one)" | bc -l)" "$flatc"
