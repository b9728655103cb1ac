#!/usr/bin/env bash
# tools/gpu/prepare_data.sh: the data the GPU machine's checks read, put
# where the device tool carries it (build-gpu/data, ignored by git, about
# 30 MB): Fashion-MNIST (the CUDA end-to-end check's epoch) and the first
# JPEGs of each CIFAR-10 class in the shared layout (its pretraining
# runs, tests/e2e_cuda.sh; tests/lib.sh reads VISC_SHARED_DATA). Run it
# here, then call the device tool with carry ["build-gpu/data"]:
#
#   bash tools/gpu/prepare_data.sh && <run> bash tools/gpu/device_check.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/lib.sh
dest=${BUILD:-build-gpu}/data
fashion=${VISC_FASHION_DIR:-/usr/share/datasets/fashion-mnist}
[ -e "$fashion/train-images-idx3-ubyte.gz" ] ||
    { echo "prepare_data: no Fashion-MNIST in $fashion (apt-get install dataset-fashion-mnist)" >&2; exit 1; }
[ -d "$shared/cifar10/train" ] || { echo "prepare_data: no CIFAR-10 JPEGs in $shared" >&2; exit 1; }
rm -rf "$dest"
mkdir -p "$dest"
cp "$fashion"/*-ubyte.gz "$dest/"
# what e2e_cuda.sh's cifar_subset takes (2 train and 1 test JPEG a class), and a few more
cifar_subset "$dest/shared/cifar10" 8 2
echo "prepare_data: $(du -sh "$dest" | cut -f1) in $dest (carry it: \"$dest\")"
