#!/usr/bin/env bash
# tools/gpu/pack_deps.sh: what the GPU machine lacks to build the whole
# program, put where the device tool carries it (build-gpu/deps, ignored by
# git, about 10 MB). That machine's image holds CUDA's compiler, PyTorch and
# its NVIDIA wheels, but none of the engine's Debian libraries: without
# oneDNN, libjpeg-turbo and libpng only the kernels' test builds there, and
# neither the models against the CPU, the end-to-end check nor the
# benchmark can run. So this takes from Debian (here, where apt works):
#   debs/          oneDNN (and the OpenCL loader it links), libjpeg-turbo,
#                  libpng, zlib's headers: unpacked there by
#                  tools/gpu/device_check.sh into a prefix of their own
#                  (dpkg-deb -x, never into /), named by CPATH, LIBRARY_PATH
#                  and LD_LIBRARY_PATH
#   cuda-include/  this toolkit's cuBLASLt, cuDNN and NCCL headers, for a
#                  toolkit there without them (the libraries come from the
#                  PyTorch wheels)
# Run it here, then call the device tool with carry ["build-gpu/deps",
# "build-gpu/data"]:
#
#   bash tools/gpu/pack_deps.sh && bash tools/gpu/prepare_data.sh &&
#       <run> bash tools/gpu/device_check.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=${BUILD:-build-gpu}/deps
packages=(libdnnl2 libdnnl-dev ocl-icd-libopencl1 libjpeg62-turbo libjpeg62-turbo-dev
          libpng16-16 libpng-dev zlib1g-dev)
rm -rf "$dest"
mkdir -p "$dest/debs" "$dest/cuda-include"
# apt-get download writes into the current folder, as the user running it
(cd "$dest/debs" && apt-get download "${packages[@]}") ||
    { echo "pack_deps: apt-get download failed (is the Debian mirror reachable?)" >&2; exit 1; }
for f in "$dest"/debs/*%3a*; do # epochs ("1:2.1.5") come as %3a: plain names travel safer
    [ -e "$f" ] && mv "$f" "${f//%3a/_}"
done
cuda_home=${CUDA_HOME:-/usr/local/cuda}
found=0
for h in "$cuda_home"/include/cublasLt.h "$cuda_home"/include/cublas_api.h \
    "$cuda_home"/include/cudnn*.h "$cuda_home"/include/nccl.h "$cuda_home"/include/nccl_device.h; do
    [ -f "$h" ] && cp "$h" "$dest/cuda-include/" && found=1
done
[ -d "$cuda_home/include/nccl_device" ] && cp -r "$cuda_home/include/nccl_device" "$dest/cuda-include/"
[ $found -eq 1 ] || echo "pack_deps: note: no cuBLASLt, cuDNN or NCCL headers in $cuda_home/include" >&2
echo "pack_deps: $(ls "$dest/debs" | wc -l) packages, $(du -sh "$dest" | cut -f1) in $dest (carry it: \"$dest\")"
