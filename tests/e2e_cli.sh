#!/usr/bin/env bash
# The visc program's surface: help texts, model list, config files with flag
# overrides, the progress bar on a terminal, and `visc plot`.
set -euo pipefail
V=${VISC:-build/visc}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# (outputs captured first: grep -q closing a pipe early would fail the writer under pipefail)
has() { grep -q -- "$2" <<<"$1"; }
has "$("$V" help)" "usage: visc <command>"
has "$("$V" version)" "^visc "
has "$("$V" models)" "^resnet50$"
has "$("$V" train --help)" "--batch-size, -b V"
if "$V" 2>/dev/null; then # no command: usage on stderr, non-zero exit
    echo "visc with no command exited 0" >&2; exit 1
fi

# A config file sets options, a flag overrides it; the resolved values are in the log.
cat >"$tmp/run.ini" <<'INI'
# comment
model = resnet14
epochs = 3
INI
printf 'batch-size = 16\nlr = 0.05   ; inline comment\nsched = step\nlr-step = 1\n' >>"$tmp/run.ini"
"$V" train --config "$tmp/run.ini" --epochs 1 --max-steps 3 --print-freq 1 --output "$tmp/cfg" >"$tmp/out.txt"
cat "$tmp/out.txt"
grep -q '"model":"resnet14"' "$tmp/cfg/log.jsonl"
grep -q '"epochs":1,' "$tmp/cfg/log.jsonl"        # the flag won over the file's 3
grep -q '"batch_size":16' "$tmp/cfg/log.jsonl"
grep -q '"lr":0.05' "$tmp/cfg/log.jsonl"
[ "$(grep -c '"type":"train"' "$tmp/cfg/log.jsonl")" -eq 3 ]   # --print-freq 1: one line per step
grep -q "1/3750 .*loss" "$tmp/out.txt"                         # plain lines when not a terminal

# On a terminal the progress bar redraws one line in place.
script -qec "$V train --model resnet14 --batch-size 16 --epochs 1 --max-steps 4 --print-freq 1 --output $tmp/tty" \
    "$tmp/tty.txt" >/dev/null
grep -q $'\r\033\[K' "$tmp/tty.txt"
grep -q 'epoch 1/1 \[' "$tmp/tty.txt"

# A finished epoch draws curves.png; `visc plot` redraws it anywhere. (A
# small image folder: a whole Fashion-MNIST epoch took minutes in the
# coverage build, and the plot needs only a finished epoch.)
source tests/lib.sh
cifar_subset "$tmp/data" 10 5
"$V" train --model resnet14 --data "imagenet:$tmp/data" --input-size 32 --crop-pct 1 --epochs 2 \
    --batch-size 20 --lr 0.05 --print-freq 1 --no-progress --eval-interval 3 --output "$tmp/ep" >/dev/null
[ "$(grep -c '"type":"val"' "$tmp/ep/log.jsonl")" -eq 2 ]
# --eval-interval 3 over 2 x 5 steps: steps 3, 6 and 9; every record has its time
[ "$(sed -n 's/.*"type":"val_step","step":\([0-9]*\),.*"time":[0-9.]*}$/\1/p' "$tmp/ep/log.jsonl" | tr '\n' ' ')" = "3 6 9 " ]
[ "$(grep -vc '"time":[0-9.]*}$' "$tmp/ep/log.jsonl")" -eq 0 ]
[ -s "$tmp/ep/curves.png" ]
has "$("$V" plot "$tmp/ep" -o "$tmp/again.png")" "wrote"
[ "$(head -c 8 "$tmp/again.png" | od -An -tx1 | tr -d ' ')" = 89504e470d0a1a0a ]
echo "cli ok"
