#!/usr/bin/env bash
# `visc pack` end to end: a small ImageFolder packs into several shards with
# the right counts; bad input (a non-image named .jpg, bad flags) is one
# clear error line, never a crash or a half-written pack.
set -uo pipefail
V=${VISC:-build/visc}
data=../shared/data/cifar10/train
[ -d "$data" ] || data=/work/shared/data/cifar10/train
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fails=0
for c in airplane cat ship; do
    mkdir -p "$tmp/src/$c"
    for i in 0000 0001 0002 0003 0004; do cp "$data/$c/$i.jpg" "$tmp/src/$c/"; done
done
export VISC_CACHE_DIR="$tmp/cache"
out=$("$V" pack "$tmp/src" "$tmp/p1" --shard-size 8K --quiet 2>&1) || { echo "FAIL: pack: $out"; fails=$((fails + 1)); }
grep -q "packed 15 images of 3 classes" <<<"$out" || { echo "FAIL: unexpected output: $out"; fails=$((fails + 1)); }
[ -f "$tmp/p1/index.bin" ] && [ -f "$tmp/p1/shard-00001.bin" ] || { echo "FAIL: index or second shard missing"; fails=$((fails + 1)); }
out=$("$V" pack "imagefolder:$tmp/src" "$tmp/p2" --shorter-side 16 --quality 80 --quiet 2>&1) || { echo "FAIL: resized pack: $out"; fails=$((fails + 1)); }
out=$("$V" pack "imagefolder:$tmp/src" "$tmp/p3" --raw --subset 2 --quiet 2>&1) || { echo "FAIL: raw pack: $out"; fails=$((fails + 1)); }
grep -q "packed 6 images" <<<"$out" || { echo "FAIL: subset: $out"; fails=$((fails + 1)); }
[ "$(stat -c %s "$tmp/p3/shard-00000.bin")" -eq $((6 * 32 * 32 * 3)) ] || { echo "FAIL: raw shard size"; fails=$((fails + 1)); }

expect() { # expect STATUS PATTERN ARGS...
    local want=$1 pattern=$2; shift 2
    local err rc
    err=$(timeout 60 "$V" pack "$@" 2>&1 >/dev/null); rc=$?
    if [ $rc -ne "$want" ] || ! grep -q -- "$pattern" <<<"$err"; then
        echo "FAIL: visc pack $* -> exit $rc, stderr: $err"; fails=$((fails + 1))
    else
        echo "ok: visc pack $* -> $(head -1 <<<"$err")"
    fi
}
expect 2 "quality" "$tmp/src" "$tmp/x" --quality 0
expect 2 "shard-size" "$tmp/src" "$tmp/x" --shard-size 12parsecs
expect 2 "exclude" "$tmp/src" "$tmp/x" --max-side 10 --shorter-side 10
expect 1 "no-such" "$tmp/no-such" "$tmp/x"
echo "I am text" >"$tmp/src/cat/fake.jpg"
expect 1 "fake.jpg" "$tmp/src" "$tmp/p4" --max-side 8
[ ! -e "$tmp/p4/index.bin" ] || { echo "FAIL: a failed pack left an index"; fails=$((fails + 1)); }
[ $fails -eq 0 ]
