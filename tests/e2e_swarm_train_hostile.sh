#!/usr/bin/env bash
# Hostile peers in whole training runs (`visc train --swarm`): honest peers
# train together while an admitted but malicious peer
# (tests/swarm_hostile_trainer.c) attacks. The honest peers must detect and
# reject it (logged), and their model must be unaffected.
#  1. In lockstep, a client peer that sends NaN (then 1e8) in every part of
#     the all-reduce: the reducers drop it from every part, the honest peers
#     step with the rest of the group's exact mean, and end bit-identical to
#     two honest peers training without it.
#  2. In lockstep, a full peer (a reducer of every round) that sends NaN
#     in the results it reduces: the round fails for the honest peers, who
#     then exclude it from their groups (logged), retry as a pair, take
#     every step and end bit-identical to the two honest peers without it.
#     (Without a ban that outlives the round, every retry of every step
#     would fail.)
#  3. Free-running, one peer forges its progress records (sample counts
#     growing far faster than its claimed throughput) and another
#     advertises the epoch after the swarm's, which no other peer has
#     reached, served by a donor of poisoned bytes: the first is
#     distrusted, the second not followed (or distrusted, when it looks
#     more than one ahead); the honest peers take every step, end
#     bit-identical, and their loss goes down.
set -uo pipefail
# V, tmp, pids (killed at exit), fail, $tmp/secret, boot RUN
. "$(dirname "$0")/swarm_run_lib.sh"
. "$(dirname "$0")/swarm_checks.sh"
H=${HOSTILE_BIN:-$(dirname "$V")/tests/swarm_hostile_trainer}
[ -x "$H" ] || { echo "no $H: the swarm is not built (make tests, SWARM=1)"; exit 1; }
peer() { # peer RUN NAME args...: one honest peer (its key and output under $tmp/NAME)
    local run=$1 name=$2; shift 2
    timeout -k 10 300 "$V" train "$@" --output "$tmp/$name" --swarm --run-id "$run" \
        --key "$tmp/$name.key" --swarm-secret-file "$tmp/secret" --listen 127.0.0.1:0 \
        --initial-peers "$boot" >"$tmp/$name.log" 2>&1
}
hostile() { # hostile RUN NAME args...: the malicious peer (exec: $! of a
    # background call is the tool itself, which cleanup can kill; it bounds
    # its own run with --seconds or --max-steps)
    local run=$1 name=$2; shift 2
    exec "$H" --run-id "$run" --key "$tmp/$name.key" --secret "$tmp/secret" \
        --initial-peers "$boot" "$@" >"$tmp/$name.log" 2>&1
}
id_of() { sed -n 's/^hostile peer \([0-9a-f]*\)$/\1/p' "$tmp/$1.log"; }
same() { # same A B: bit-identical weights, BatchNorm counters included (lockstep)
    "$V" diff "$tmp/$1/model_last.safetensors" "$tmp/$2/model_last.safetensors" --rtol 0 --atol 0 \
        >"$tmp/diff-$1-$2" 2>&1 || { cat "$tmp/diff-$1-$2"; fail "$1 and $2 ended with different weights"; }
}
finished() { # finished NAME STEPS: the peer ran to the end
    grep -q "swarm: $2 steps" "$tmp/$1.log" || { tail -5 "$tmp/$1.log"; fail "$1 did not take $2 steps"; }
}

# 1. NaN / huge gradients into the all-reduce (lockstep, bit-exact)
lock=(--model resnet14 --epochs 1 --batch-size 16 --max-steps 4 --seed 5 --no-progress
      --print-freq 0 --threads 1 --opt sgd --lr 0.05 --target-batch-size 32 --lockstep
      --matchmaking-time 3)
boot ref
peer ref ref0 "${lock[@]}" --swarm-shard 0/2 --group-size 2 & a=$!
peer ref ref1 "${lock[@]}" --swarm-shard 1/2 --group-size 2 & b=$!
wait $a || fail "reference peer 0 failed"; wait $b || fail "reference peer 1 failed"
same ref0 ref1
for attack in nan huge; do
    boot "$attack"
    hostile "$attack" "h-$attack" --attack "$attack" --target 32 --group-size 3 --batch-size 16 \
        --max-steps 4 --seed 5 --output "$tmp/h-$attack" &
    hp=$!
    pids+=($hp)
    peer "$attack" "$attack-0" "${lock[@]}" --swarm-shard 0/2 --group-size 3 & a=$!
    peer "$attack" "$attack-1" "${lock[@]}" --swarm-shard 1/2 --group-size 3 & b=$!
    wait $a || fail "$attack: honest peer 0 failed"
    wait $b || fail "$attack: honest peer 1 failed"
    kill -9 $hp 2>/dev/null # it would go on trying to join (and poison) rounds
    hid=$(id_of "h-$attack")
    [ -n "$hid" ] || fail "$attack: the hostile peer did not start"
    for p in "$attack-0" "$attack-1"; do
        finished "$p" 4
        grep -q "member [0-9]* (${hid:-none}): banned: invalid data.*rest of the group averaged everything" \
            "$tmp/$p.log" || fail "$p: no round reported the hostile member $hid banned"
        grep -q "swarm: 4 steps.* [1-9][0-9]* members dropped" "$tmp/$p.log" ||
            fail "$p: $(grep 'steps,' "$tmp/$p.log")"
    done
    same "$attack-0" "$attack-1"
    same "$attack-0" ref0 # unaffected: where the honest peers end without it
    echo "$attack: $(grep -m1 'averaged everything' "$tmp/$attack-0.log")"
done

# 2. a lying reducer (lockstep, bit-exact)
boot reducer
hostile reducer h-reducer --attack reducer --target 32 --group-size 3 --batch-size 16 \
    --max-steps 4 --seed 5 --output "$tmp/h-reducer" &
hp=$!
pids+=($hp)
for _ in $(seq 100); do [ -n "$(id_of h-reducer)" ] && break; sleep 0.1; done
peer reducer reducer-0 "${lock[@]}" --swarm-shard 0/2 --group-size 3 & a=$!
peer reducer reducer-1 "${lock[@]}" --swarm-shard 1/2 --group-size 3 & b=$!
wait $a || fail "reducer: honest peer 0 failed"
wait $b || fail "reducer: honest peer 1 failed"
kill -9 $hp 2>/dev/null
hid=$(id_of h-reducer)
[ -n "$hid" ] || fail "reducer: the hostile peer did not start"
for p in reducer-0 reducer-1; do
    finished "$p" 4
    grep -q "member ${hid:-none} sent invalid data: not grouped with" "$tmp/$p.log" ||
        fail "$p: the lying reducer $hid was not excluded"
    # it was in a group once (the round that exposed it), never again
    n=$(grep -c "($hid): banned" "$tmp/$p.log")
    [ "$n" -eq 1 ] || fail "$p: $n rounds with the lying reducer $hid (want 1)"
done
same reducer-0 reducer-1
same reducer-0 ref0
echo "reducer: $(grep -m1 'not grouped with' "$tmp/reducer-0.log")"

# 3. forged progress and a poisoned donor ahead (free-running)
free=(--model resnet14 --epochs 1 --batch-size 16 --max-steps 16 --seed 3 --no-progress
      --print-freq 1 --threads 1 --opt sgd --lr 0.05 --target-batch-size 48
      --matchmaking-time 2 --swarm-linger 5)
boot free
hostile free forger --attack forge --target 48 --seconds 240 & pids+=($!)
hostile free liar --attack epoch --target 48 --seconds 240 & pids+=($!)
for _ in $(seq 100); do [ -n "$(id_of forger)" ] && [ -n "$(id_of liar)" ] && break; sleep 0.1; done
declare -A pid
for i in 0 1 2; do
    "$V" train "${free[@]}" --swarm-shard "$i/3" --output "$tmp/f$i" --swarm \
        --run-id free --key "$tmp/f$i.key" --swarm-secret-file "$tmp/secret" \
        --listen 127.0.0.1:0 --initial-peers "$boot" >"$tmp/f$i.log" 2>&1 &
    pid[$i]=$!
    pids+=($!)
done
for i in 0 1 2; do exits_cleanly "f$i" "${pid[$i]}"; done
fid=$(id_of forger) lid=$(id_of liar)
for i in 0 1 2; do
    finished "f$i" 16
    grep -q "distrusting peer $fid" "$tmp/f$i.log" || fail "f$i did not distrust the forger $fid"
    # not followed while it is one ahead, distrusted when it seems further
    grep -q "peer $lid publishes epoch .* not followed\|distrusting peer $lid: epoch" \
        "$tmp/f$i.log" || fail "f$i did not reject the lone epoch of $lid"
done
grep -h "distrusting peer\|not followed" "$tmp"/f0.log
same_params f0 f1
same_params f0 f2
loss_goes_down f0 6 0.9

[ $fails -eq 0 ] && echo "swarm training with hostile peers: all checks passed"
exit $((fails > 0))
