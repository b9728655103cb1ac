#!/usr/bin/env bash
# An auxiliary peer (`visc train --swarm --auxiliary`): no training, only
# its share of every round's all-reduce with weight 0.
#  1. Three peers in lockstep (each batch 8 on its shard i/3) with one
#     auxiliary end bit-identical to each other and to the same three peers
#     without it; the auxiliary's log shows it reduced a part of the vector
#     in every one of the 4 rounds, and the peers' rounds were groups of 4.
#  2. Free-running (no --lockstep, target batch 192): the auxiliary publishes
#     an auxiliary record, so the three peers wait for it in their groups
#     (instead of leaving a peer out when it joins first); the peers end
#     bit-identical, and the auxiliary reduced in most of the 6 steps.
set -uo pipefail
source tests/swarm_run_lib.sh

vit=(--model vit_femto_patch4_28 --epochs 1 --max-steps 4 --seed 3 --no-progress --print-freq 0
     --threads 1 --opt adamw --lr 0.001 --target-batch-size 24 --lockstep --matchmaking-time 5)
member() { # member RUN NAME args...
    local run=$1 name=$2; shift 2
    timeout -k 10 300 "$V" train "${vit[@]}" "$@" --output "$tmp/$name" --swarm --run-id "$run" \
        --key "$tmp/$name.key" --swarm-secret-file "$tmp/secret" --listen 127.0.0.1:0 \
        --initial-peers "$boot" >"$tmp/$name.log" 2>&1
}
same() {
    "$V" diff "$tmp/$1/model_last.safetensors" "$tmp/$2/model_last.safetensors" --rtol 0 --atol 0 \
        >/dev/null || fail "$1 and $2 ended with different weights"
}
trio() { # trio RUN GROUP_SIZE: three training peers, in the background ($ps)
    ps=()
    local i
    for i in 0 1 2; do
        member "$1" "$1-p$i" --batch-size 8 --swarm-shard "$i/3" --group-size "$2" --swarm-verbose &
        ps+=($!)
    done
}
finish() { # finish RUN: the trio's exit
    local i
    for i in 0 1 2; do
        wait "${ps[$i]}" || { tail -5 "$tmp/$1-p$i.log"; fail "$1: peer $i failed"; }
    done
}

boot plain
trio plain 3
finish plain

boot aux
trio aux 4
member aux aux-helper --batch-size 8 --group-size 4 --auxiliary --swarm-verbose &
helper=$!
finish aux
wait_bounded 60 "$helper" || { tail -5 "$tmp/aux-helper.log"; fail "the auxiliary did not end cleanly"; }

for i in 0 1 2; do same plain-p0 "aux-p$i"; done
for i in 0 1 2; do
    [ "$(grep -c "swarm: step [0-9]*: all-reduce: group 4, averaged 100.0%" "$tmp/aux-p$i.log")" -eq 4 ] ||
        fail "aux-p$i: not 4 rounds with the auxiliary: $(grep 'steps,' "$tmp/aux-p$i.log")"
done
for s in 0 1 2 3; do
    grep -Eq "auxiliary: step $s: reduced [1-9][0-9]* of its [1-9][0-9]* values .* group of 4 \(3 training\)" \
        "$tmp/aux-helper.log" || fail "the auxiliary did not reduce in step $s"
done
grep -q "auxiliary: helped 4 steps" "$tmp/aux-helper.log" ||
    fail "the auxiliary's summary: $(grep 'auxiliary: helped' "$tmp/aux-helper.log")"
[ -e "$tmp/aux-helper/model_last.safetensors" ] && fail "the auxiliary saved a model"
if [ $fails -ne 0 ]; then tail -20 "$tmp/aux-helper.log"; fi

# 2. free-running
free=(--model vit_femto_patch4_28 --epochs 1 --max-steps 6 --seed 3 --no-progress --print-freq 0
      --threads 1 --opt adamw --lr 0.001 --target-batch-size 192 --matchmaking-time 2
      --batch-size 8 --swarm-verbose)
boot free
start_peers free free-p 3 300 "${free[@]}"
timeout -k 10 300 "$V" train "${free[@]}" --auxiliary --output "$tmp/free-aux" --swarm --run-id free \
    --key "$tmp/free-aux.key" --swarm-secret-file "$tmp/secret" --listen 127.0.0.1:0 \
    --initial-peers "$boot" >"$tmp/free-aux.log" 2>&1 &
helper=$!
for i in 0 1 2; do
    wait "${ps[$i]}" || { tail -5 "$tmp/free-p$i.log"; fail "free: peer $i failed"; }
done
wait_bounded 60 "$helper" || { tail -5 "$tmp/free-aux.log"; fail "free: the auxiliary did not end cleanly"; }
for i in 1 2; do
    "$V" diff "$tmp/free-p0/model_last.safetensors" "$tmp/free-p$i/model_last.safetensors" \
        --rtol 0 --atol 0 >/dev/null || fail "free: p0 and p$i ended with different weights"
done
helped=$(sed -n 's/.*auxiliary: helped \([0-9]*\) steps.*/\1/p' "$tmp/free-aux.log")
[ "${helped:-0}" -ge 4 ] || fail "free: the auxiliary helped ${helped:-no} of 6 steps"
with=$(grep -c "all-reduce: group 4, averaged 100.0%" "$tmp/free-p0.log")
echo "free-running: the auxiliary helped ${helped:-0} of 6 steps; p0 averaged in $with groups of 4"
[ $fails -ne 0 ] && { grep "swarm" "$tmp/free-aux.log" | tail -10; grep "swarm" "$tmp/free-p0.log" | tail -10; }

[ $fails -eq 0 ] && echo "swarm auxiliary peer: all checks passed"
exit $((fails > 0))
