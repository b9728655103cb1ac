#!/usr/bin/env bash
# ssl_cifar10.sh: the CIFAR-10 MoCo v2 benchmark (the reference library's
# CIFAR-10 preset: ResNet-18 with the CIFAR stem, bank 4096, lr 0.06 x bs/128,
# wd 5e-4, momentum 0.99, temperature 0.1, batch 128, no blur; 200 epochs)
# on the CIFAR-10 JPEG copy, then kNN (k 200, t 0.1) and, unless EVALS says
# otherwise, the linear and finetune evaluations. Prints the results table
# (kNN top-1 and the wall times) that `visc bench-ssl` writes.
#
# The full preset is a GPU job (200 epochs of 50,000 images). Scaled down to
# fit a CPU here: EPOCHS (default 200) epochs over SUBSET images per class
# (default all 5,000), LINEAR_EPOCHS / FINETUNE_EPOCHS (default the
# protocol's 90 / 30), e.g.
#   EPOCHS=3 SUBSET=500 LINEAR_EPOCHS=3 FINETUNE_EPOCHS=1 bench/ssl_cifar10.sh  # ~6 min, 2 cores
# Under mpirun: MPI="mpirun -np 2" bench/ssl_cifar10.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-../shared/data/cifar10}
[ -d "$DATA" ] || DATA=/work/shared/data/cifar10
EPOCHS=${EPOCHS:-200}
SUBSET=${SUBSET:-0}
EVALS=${EVALS:-knn,linear,finetune}
OUT=${OUT:-runs/ssl_cifar10}
make -s -j2 all
args=(--preset mocov2_resnet18_cifar10 --data "imagenet:$DATA" --epochs "$EPOCHS"
      --eval "$EVALS" --output "$OUT" --print-freq 50)
[ "$SUBSET" -gt 0 ] && args+=(--subset "$SUBSET")
[ -n "${LINEAR_EPOCHS:-}" ] && args+=(--linear-epochs "$LINEAR_EPOCHS")
[ -n "${FINETUNE_EPOCHS:-}" ] && args+=(--finetune-epochs "$FINETUNE_EPOCHS")
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
start=$(date +%s)
${MPI:-} build/visc bench-ssl "${args[@]}" | tail -8
echo "wall time: $(($(date +%s) - start)) s; load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
