#!/usr/bin/env bash
# A swarm peer killed (SIGKILL) and restarted with --resume from its own
# checkpoint (`visc train --swarm`; peers on loopback in lockstep, two per
# step). The peer is killed while it lingers after its last step, so that
# its checkpoint's step is known; what it left on disk is what a peer
# killed right after a checkpoint leaves.
#  1. The swarm waited for it (lockstep: no step without the pair): the
#     checkpoint is as new as the swarm, its state the one the swarm
#     publishes for that step, so the restarted peer keeps it (no download)
#     and trains on with the other peer; both end bit-identical.
#  2. The swarm went on without it (another peer took its place for two
#     steps): the restarted peer's checkpoint is behind, so it takes the
#     swarm's state (a download), trains on with the swarm and ends
#     bit-identical to the other peer.
set -uo pipefail
source tests/swarm_run_lib.sh
# peer RUN NAME LOG args...: one swarm peer, its key and output under
# $tmp/NAME (a restarted peer keeps both), its log in $tmp/LOG.log; the
# process becomes visc (in a subshell in the background: $! is the peer),
# or with $bound set, timeout's child
peer() {
    local run=$1 name=$2 log=$3; shift 3
    exec ${bound:+timeout -k 10 300} "$V" train "$@" --output "$tmp/$name" --swarm --run-id "$run" \
        --key "$tmp/$name.key" --swarm-secret-file "$tmp/secret" --listen 127.0.0.1:0 \
        --initial-peers "$boot" >"$tmp/$log.log" 2>&1
}
same() { # same A B: bit-identical weights
    "$V" diff "$tmp/$1/model_last.safetensors" "$tmp/$2/model_last.safetensors" --rtol 0 --atol 0 \
        >/dev/null || fail "$1 and $2 ended with different weights"
}
run=(--model vit_femto_patch4_28 --epochs 1 --seed 3 --no-progress --print-freq 0 --threads 1
     --opt adamw --lr 0.001 --batch-size 8 --target-batch-size 16 --lockstep --group-size 2
     --matchmaking-time 2)

# 1. as new as the swarm: b stops at step 3 and is killed; a waits at step 3
boot same
(peer same a a "${run[@]}" --swarm-shard 0/2 --max-steps 6) &
a=$!
pids+=("$a")
(peer same b b "${run[@]}" --swarm-shard 1/2 --max-steps 3 --swarm-linger 300) &
b=$!
pids+=("$b")
lingering b; kill -9 "$b"
wait "$b" 2>/dev/null
(bound=1 peer same b b2 "${run[@]}" --swarm-shard 1/2 --max-steps 6 \
    --resume "$tmp/b/checkpoint_last.safetensors") || { tail -5 "$tmp/b2.log"; fail "b failed after its restart"; }
wait_bounded 300 "$a" || { tail -5 "$tmp/a.log"; fail "a failed"; }
grep -q "resumed from .* step 3$" "$tmp/b2.log" || fail "b did not resume at step 3"
grep -q "swarm: 6 steps.* 0 state downloads" "$tmp/b2.log" ||
    { tail -3 "$tmp/b2.log"; fail "b did not keep its own checkpoint"; }
same a b

# 2. the swarm ahead: b stops at step 2 and is killed; c takes its place
# (downloading the state at step 2) and trains with a to step 4, where it
# stops; b restarts from its step-2 checkpoint, takes the swarm's state at
# step 4 and trains on with a to step 6
boot ahead
(peer ahead a2 a2 "${run[@]}" --swarm-shard 0/2 --max-steps 6 --swarm-linger 300) &
pids+=($!)
(peer ahead b3 b3 "${run[@]}" --swarm-shard 1/2 --max-steps 2 --swarm-linger 300) &
b=$!
pids+=("$b")
lingering b3; kill -9 "$b"
wait "$b" 2>/dev/null
(peer ahead c c "${run[@]}" --swarm-shard 1/2 --max-steps 4 --seed 99 --swarm-linger 300) &
pids+=($!)
lingering c
(bound=1 peer ahead b3 b4 "${run[@]}" --swarm-shard 1/2 --max-steps 6 \
    --resume "$tmp/b3/checkpoint_last.safetensors") || { tail -5 "$tmp/b4.log"; fail "b failed after its restart"; }
lingering a2
grep -q "resumed from .* step 2$" "$tmp/b4.log" || fail "b did not resume at step 2"
grep -q "swarm: 6 steps, 2 rounds (0 failed, 0 partial), 0 skipped, 0 local, 1 state downloads" \
    "$tmp/b4.log" || { tail -3 "$tmp/b4.log"; fail "b did not take the swarm's state and train on"; }
same a2 b3

[ $fails -eq 0 ] && echo "swarm resume: all checks passed"
exit $((fails > 0))
