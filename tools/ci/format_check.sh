#!/usr/bin/env bash
# Format gate: every .c/.h of ours (src/ include/ tests/ bench/ fuzz/
# tools/, not the generated tests/golden/*.h) is as clang-format 14 with the
# checked-in .clang-format would write it. Lists the files that differ and
# how to fix them. With --fix, reformats them in place instead (make format).
set -euo pipefail
cd "$(dirname "$0")/../.."
mapfile -t files < <(find src include tests bench fuzz tools -name '*.[ch]' \
                         ! -path 'tests/golden/*' | sort)
if [ "${1:-}" = --fix ]; then
    clang-format -i "${files[@]}"
    echo "format: reformatted ${#files[@]} files"
    exit 0
fi
bad=()
for f in "${files[@]}"; do
    clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
    echo "format: FAIL: ${#bad[@]} of ${#files[@]} files are not clang-formatted:"
    printf '  %s\n' "${bad[@]}"
    echo "format: fix with 'make format' (or clang-format -i FILE), and see the diff with"
    echo "        clang-format FILE | diff FILE -"
    exit 1
fi
echo "format: ok: ${#files[@]} files"
