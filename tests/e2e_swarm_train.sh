#!/usr/bin/env bash
# Collaborative training (`visc train --swarm`): peer processes on loopback,
# joined through a standing `visc swarm node`.
#  1. One peer with target batch B ends bit-exactly where plain training
#     with batch B ends (a swarm of one steps alone, by design).
#  2. Four peers in lockstep, each with batch B/4 on its shard i/4, end where
#     one process with batch B ends (ViT: no BatchNorm; SGD and AdamW;
#     `visc diff --base W0`: the two runs' weight changes agree normwise),
#     and bit-identically to each other (they apply the same averaged
#     gradient at every step).
#     --swarm-verbose logs one line per round.
#  3. A peer that joins late downloads the swarm's state (parameters,
#     optimizer, step) and ends bit-identical to the peers that started it.
set -uo pipefail
source tests/swarm_run_lib.sh

peer() { # peer RUN NAME args...: one swarm peer (its key and output under $tmp/NAME)
    local run=$1 name=$2; shift 2
    timeout -k 10 300 "$V" train "$@" --output "$tmp/$name" --swarm --run-id "$run" --key "$tmp/$name.key" \
        --swarm-secret-file "$tmp/secret" --listen 127.0.0.1:0 --initial-peers "$boot" \
        >"$tmp/$name.log" 2>&1
}
same() { # same A B: bit-identical weights
    "$V" diff "$tmp/$1/model_last.safetensors" "$tmp/$2/model_last.safetensors" --rtol 0 --atol 0 \
        >/dev/null || fail "$1 and $2 ended with different weights"
}

# 1. a swarm of one is plain training
one=(--model resnet14 --epochs 1 --batch-size 32 --max-steps 4 --seed 3 --no-progress --print-freq 0
     --threads 1)
"$V" train "${one[@]}" --output "$tmp/plain" >/dev/null || fail "plain training failed"
boot one
peer one alone "${one[@]}" --target-batch-size 32 --matchmaking-time 1 || { cat "$tmp/alone.log"; fail "a lone peer failed"; }
same plain alone
grep -q "swarm: 4 steps" "$tmp/alone.log" || fail "the lone peer did not report 4 steps"

# 2. four peers in lockstep = one process with the whole batch
vit=(--model vit_femto_patch4_28 --epochs 1 --max-steps 4 --seed 3 --no-progress --print-freq 0
     --threads 1)
lockstep() { # lockstep NAME RTOL optimizer-args...
    local name=$1 rtol=$2; shift 2
    "$V" train "${vit[@]}" "$@" --batch-size 32 --lr 0 --max-steps 1 --output "$tmp/$name-w0" >/dev/null
    "$V" train "${vit[@]}" "$@" --batch-size 32 --output "$tmp/$name-1" >/dev/null
    local ps=() i
    boot "$name"
    for i in 0 1 2 3; do
        peer "$name" "$name-p$i" "${vit[@]}" "$@" --batch-size 8 --target-batch-size 32 --lockstep \
            --swarm-shard "$i/4" --group-size 4 --matchmaking-time 3 --swarm-verbose &
        ps+=($!)
    done
    for i in 0 1 2 3; do
        wait "${ps[$i]}" || { tail -5 "$tmp/$name-p$i.log"; fail "$name: peer $i failed"; }
    done
    printf '%-16s ' "$name:"
    "$V" diff "$tmp/$name-p0/model_last.safetensors" "$tmp/$name-1/model_last.safetensors" \
        --base "$tmp/$name-w0/model_last.safetensors" --rtol "$rtol" --atol 0 ||
        fail "$name: 4 peers differ from 1 process"
    for i in 1 2 3; do same "$name-p0" "$name-p$i"; done
    grep -q "4 steps, 4 rounds (0 failed, 0 partial)" "$tmp/$name-p0.log" ||
        fail "$name: $(grep 'steps,' "$tmp/$name-p0.log")"
    # --swarm-verbose: one line per round
    [ "$(grep -c "swarm: step [0-9]*: all-reduce: group 4, averaged 100.0%" "$tmp/$name-p0.log")" -eq 4 ] ||
        fail "$name: not one line per round: $(grep -c 'all-reduce: group' "$tmp/$name-p0.log")"
}
lockstep vit-sgd 1e-5 --opt sgd --lr 0.01
lockstep vit-adamw 1e-4 --opt adamw --lr 0.001 --wd 0.05

# 3. a late joiner takes the swarm's state: two peers train 6 steps and
# stay as donors (--swarm-linger); a newcomer with another seed downloads
# their state and, asked to stop at step 6, ends exactly there
late=(--model vit_femto_patch4_28 --epochs 1 --seed 3 --no-progress --print-freq 0 --threads 1
      --opt adamw --lr 0.001 --batch-size 8 --target-batch-size 16 --lockstep --group-size 2
      --matchmaking-time 3 --max-steps 6)
boot late
peer late early0 "${late[@]}" --swarm-shard 0/2 --swarm-linger 120 &
pids+=($!)
peer late early1 "${late[@]}" --swarm-shard 1/2 --swarm-linger 120 &
pids+=($!)
lingering early0 early1
same early0 early1
peer late newcomer "${late[@]}" --seed 99 || { tail -5 "$tmp/newcomer.log"; fail "newcomer failed"; }
grep -q "1 state downloads" "$tmp/newcomer.log" || { tail -5 "$tmp/newcomer.log"; fail "the newcomer did not download the state"; }
same early0 newcomer

[ $fails -eq 0 ] && echo "swarm training: all checks passed"
exit $((fails > 0))
