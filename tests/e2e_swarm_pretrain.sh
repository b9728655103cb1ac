#!/usr/bin/env bash
# Collaborative self-supervised pretraining (`visc pretrain --swarm`): peer
# processes on loopback, joined through a standing `visc swarm node`, on
# the tiny CIFAR-10 subset of e2e_ssl.sh.
#  1. One MoCo v2 peer with target batch B ends bit-exactly where plain
#     `visc pretrain` with batch B ends: the whole checkpoint (query and
#     momentum encoders, heads, optimizer state, memory bank) is the same.
#     Exact by design: a swarm of one steps alone with its own gradient,
#     the schedules' steps per epoch (images / target batch) equal the
#     loader's, and the momentum encoder advances once per step either way.
#  2. Two MoCo v2 peers in lockstep, each on its half of the data, end with
#     the same query encoder, momentum encoder, heads and optimizer state
#     bit for bit (they apply the same averaged gradient and advance the
#     momentum encoder once per global step from the same weights); only
#     their memory banks differ (each peer's own keys, by design). Their
#     losses are finite.
#  3. The same for SimCLR (LARS, BatchNorm in the projection head), and for
#     MoCo v2 in parameter mode (--averaging parameters: the momentum
#     encoder travels with the averaged buffers).
#  4. Resume: of two MoCo v2 peers, one stops at step 2 and is killed
#     (SIGKILL, while it lingers: its checkpoint's step is known); the other
#     waits for it (lockstep). Restarted with --resume, it keeps its own
#     checkpoint (as new as the swarm: no download) and both go on to step
#     4, identical.
#  5. A MoCo v2 peer that joins late (another seed) downloads the swarm's
#     state, momentum encoder included, and ends identical to the others.
#  6. Bad swarm flags: one line, status 1.
set -uo pipefail
source tests/lib.sh
source tests/swarm_run_lib.sh
export VISC_CACHE_DIR="$tmp/cache"

# 20 train / 10 test images of each CIFAR-10 class: 10 batches of 20
cifar_subset "$tmp/data" 20 10
common=(--data "imagenet:$tmp/data" --model resnet14 --width 16 --input-size 32 --crop-pct 1
        --bank-size 100 --seed 3 --no-progress --print-freq 1 --workers 1 --threads 1 --epochs 1)

# peer RUN NAME args...: one swarm peer (its key and output under
# $tmp/NAME); with $exec_peer set (in a background subshell) the process
# becomes visc itself, so that $! is the peer (no timeout: killed at exit)
peer() {
    local run=$1 name=$2; shift 2
    local how=(timeout -k 10 300)
    [ -n "${exec_peer:-}" ] && how=(exec)
    "${how[@]}" "$V" pretrain "$@" --output "$tmp/$name" --swarm --run-id "$run" \
        --key "$tmp/$name.key" --swarm-secret-file "$tmp/secret" --listen 127.0.0.1:0 \
        --initial-peers "$boot" >"$tmp/$name.log" 2>&1
}
# same A B [ALLOWED]: the two checkpoints hold the same numbers, but for
# the tensors matching the regex ALLOWED (each peer's own memory bank, its
# BatchNorm update counters)
same() {
    local out listed count
    out=$("$V" diff "$tmp/$1/checkpoint_last.safetensors" "$tmp/$2/checkpoint_last.safetensors" \
        --rtol 0 --atol 0)
    count=$(sed -n 's/^[0-9]* tensors, \([0-9]*\) differ.*/\1/p' <<<"$out")
    listed=$(grep '^differs:' <<<"$out" | awk '{ print $2 }')
    [ -n "$count" ] && [ "$count" -eq "$(grep -c . <<<"$listed")" ] || [ "$count" = 0 ] ||
        { fail "$1 vs $2: $out"; return; }
    listed=$(grep -Ev "^(${3:-^$})$" <<<"$listed")
    [ -z "$listed" ] || fail "$1 and $2 differ in: $(tr '\n' ' ' <<<"$listed")"
}
finite_losses() { # finite_losses NAME: every train line's loss is a number
    local n
    n=$(grep -c '"type":"train"' "$tmp/$1/log.jsonl")
    [ "$n" -gt 0 ] || fail "$1: no train lines"
    grep '"type":"train"' "$tmp/$1/log.jsonl" | grep -qv '"loss":[-0-9.e]*,' &&
        fail "$1: a loss that is not a finite number"
    return 0
}

# 1. a swarm of one is plain pretraining
"$V" pretrain "${common[@]}" --batch-size 20 --max-steps 4 --output "$tmp/plain" >/dev/null ||
    fail "plain pretraining failed"
boot one
peer one alone "${common[@]}" --batch-size 20 --max-steps 4 --target-batch-size 20 \
    --matchmaking-time 1 || { tail -5 "$tmp/alone.log"; fail "a lone peer failed"; }
same plain alone
grep -q "swarm: 4 steps" "$tmp/alone.log" || fail "the lone peer did not report 4 steps"

# 2, 3. two peers in lockstep, each with half the batch on half the data
pair() { # pair NAME args...
    local name=$1 i ps=(); shift
    boot "$name"
    for i in 0 1; do
        peer "$name" "$name-p$i" "${common[@]}" "$@" --batch-size 10 --target-batch-size 20 \
            --lockstep --swarm-shard "$i/2" --group-size 2 --matchmaking-time 3 --max-steps 4 &
        ps+=($!)
    done
    for i in 0 1; do
        wait "${ps[$i]}" || { tail -5 "$tmp/$name-p$i.log"; fail "$name: peer $i failed"; }
    done
    same "$name-p0" "$name-p1" 'memory_bank.bank'
    grep -q "4 steps, 4 rounds (0 failed, 0 partial)" "$tmp/$name-p0.log" ||
        fail "$name: $(grep 'steps,' "$tmp/$name-p0.log")"
    finite_losses "$name-p0"
    finite_losses "$name-p1"
    echo "$name: 2 peers identical after 4 global steps"
}
pair moco
pair simclr --method simclr
pair moco-params --averaging parameters


# 4. resume: early1 stops at step 2 and is killed, early0 waits for it at
# step 2; early1 restarts from its checkpoint; both stay as donors
late=("${common[@]}" --batch-size 10 --target-batch-size 20 --lockstep --group-size 2
      --matchmaking-time 3)
boot late
(exec_peer=1 peer late early0 "${late[@]}" --swarm-shard 0/2 --max-steps 4 --swarm-linger 120) &
pids+=($!)
(exec_peer=1 peer late early1 "${late[@]}" --swarm-shard 1/2 --max-steps 2 --swarm-linger 300) &
killed=$!
pids+=("$killed")
lingering early1; kill -9 "$killed"
wait "$killed" 2>/dev/null
mv "$tmp/early1.log" "$tmp/early1-first.log"
(exec_peer=1 peer late early1 "${late[@]}" --swarm-shard 1/2 --max-steps 4 --swarm-linger 120 \
    --resume "$tmp/early1/checkpoint_last.safetensors") &
pids+=($!)
lingering early0 early1
grep -q "resumed from .* step 2$" "$tmp/early1.log" || fail "early1 did not resume at step 2"
grep -q "swarm: 4 steps.* 0 state downloads" "$tmp/early1.log" ||
    { tail -3 "$tmp/early1.log"; fail "early1 did not keep its own checkpoint"; }
same early0 early1 'memory_bank.bank'

# 5. a late joiner: a newcomer with another seed downloads the state of
# early0 and early1 (query and momentum encoders, heads, optimizer) and,
# asked to stop at step 4, ends there
late+=(--max-steps 4)
peer late newcomer "${late[@]}" --seed 99 || { tail -5 "$tmp/newcomer.log"; fail "newcomer failed"; }
grep -q "1 state downloads" "$tmp/newcomer.log" ||
    { tail -5 "$tmp/newcomer.log"; fail "the newcomer did not download the state"; }
# the newcomer's bank holds its random start (it computed no keys)
same early0 newcomer 'memory_bank.bank'

# bad input: one line, status 1
expect_error() { # pattern command...
    local pattern=$1 status=0
    shift
    "$@" >"$tmp/out" 2>"$tmp/err" || status=$?
    if [ $status -ne 1 ] || [ "$(wc -l <"$tmp/err")" -ne 1 ] || ! grep -q "$pattern" "$tmp/err"; then
        cat "$tmp/err"
        fail "status $status, not one line with '$pattern': $*"
    fi
}
expect_error "need --swarm" "$V" pretrain "${common[@]}" --target-batch-size 20 --output "$tmp/e"
expect_error "needs --target-batch-size" "$V" pretrain "${common[@]}" --swarm --run-id e \
    --swarm-secret-file "$tmp/secret" --output "$tmp/e"

[ $fails -eq 0 ] && echo "swarm pretraining: all checks passed"
exit $((fails > 0))
