#!/usr/bin/env bash
# cu2cpp.sh IN OUT: a CUDA source rewritten for the host's C++ compiler and
# the emulator (emu.h), line for line (a #line keeps errors and debuggers
# on IN's lines):
#   kernel<<<grid, block, shared, stream>>>(args)   (or kernel<T>)
#       -> VISC_EMU_LAUNCH(kernel, grid, block, shared, stream)(args)
#   __shared__ T name[N]...;
#       -> name refers to this block's array (visc_emu::shared)
#   extern __shared__ T name[];
#       -> T *name = the launch's dynamic shared memory
# Anything else with __shared__ (several names in one declaration, a
# scalar) is refused, so no declaration is left as a static by mistake.
set -euo pipefail
in=$1 out=$2
mkdir -p "$(dirname "$out")"
{
    printf '#line 1 "%s"\n' "$in"
    perl -0pe '
        s/\b(\w+(?:<[^<>]*>)?)\s*<<<(.*?)>>>\s*\(/VISC_EMU_LAUNCH($1, $2)(/gs;
        s/\bextern\s+__shared__\s+([\w\s]*?\w)\s+(\w+)\s*\[\s*\]\s*;/$1 *$2 = ($1 *)visc_emu::dynamic_shared();/g;
        s/\b__shared__\s+([\w\s:]*?\w)\s+(\w+)\s*((?:\[[^\]]+\])+)\s*;/static const char visc_emu_key_$2 = 0; $1(&$2)$3 = *($1(*)$3)visc_emu::shared(&visc_emu_key_$2, sizeof($1$3), alignof($1));/g;
    ' "$in"
} >"$out.tmp"
if grep -n '__shared__\|<<<' "$out.tmp" | grep -v '^[0-9]*:\s*\(//\|/\*\|\*\)' >&2; then
    echo "cu2cpp.sh: $in: a __shared__ declaration or launch the rewrite does not know (above)" >&2
    rm -f "$out.tmp"
    exit 1
fi
mv "$out.tmp" "$out"
