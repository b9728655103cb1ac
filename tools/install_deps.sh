#!/usr/bin/env bash
# Installs the Debian packages visc needs, if any are missing. Used by
# `make demo`, `make test` and CI. Extra package names may be passed as
# arguments (CI adds the quality-gate tools).
set -euo pipefail
packages=(build-essential libdnnl-dev libjpeg62-turbo-dev libpng-dev zlib1g-dev libopenmpi-dev openmpi-bin
          libsodium-dev libopendht-c-dev iproute2
          dataset-fashion-mnist bc "$@")
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}"
if [ "$(id -u)" -eq 0 ]; then
    sudo=()
elif command -v sudo >/dev/null; then
    sudo=(sudo)
else
    echo "visc: missing packages ${missing[*]}; install them with: apt-get install ${missing[*]}" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
