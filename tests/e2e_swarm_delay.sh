#!/usr/bin/env bash
# Delayed parameter updates (`--delay-updates`): a step's all-reduce runs
# in the background while the next batches are computed, and its mean
# gradient is applied one step late. No exact reference: one process has
# no delayed-gradient mode.
#  1. Lockstep: three peers (batch 16 on their shards i/3) end bit-identical
#     to each other, every round averaged, the loss goes down, and each
#     peer computed one batch more than its steps (the first batch's round
#     is applied after the second batch).
#  2. Free-running (the default mode): three peers, one of them slowed
#     down (SIGSTOP/SIGCONT), target batch 96. They reach the last step
#     and end bit-identical, no step is taken alone, the loss goes down,
#     and every peer computed batches while its rounds ran (the overlap
#     the mode is for: counted in its closing line).
set -uo pipefail
source tests/swarm_run_lib.sh
source tests/swarm_checks.sh

steps=40
args=(--model resnet14 --epochs 1 --batch-size 16 --opt sgd --lr 0.1 --no-progress --print-freq 1
      --threads 1 --max-steps "$steps" --seed 5 --target-batch-size 48 --lockstep --group-size 3
      --matchmaking-time 5 --delay-updates --swarm-verbose)
boot delay
start_peers delay p 3 400 "${args[@]}"
for i in 0 1 2; do exits_cleanly "p$i" "${ps[$i]}" 400; done
for i in 1 2; do same_params p0 "p$i"; done
for i in 0 1 2; do
    grep -q "swarm: $steps steps, $steps rounds (0 failed, 0 partial), 0 skipped" "$tmp/p$i.log" ||
        fail "p$i: $(grep 'steps,' "$tmp/p$i.log")"
    batches=$(grep -c '"type":"train"' "$tmp/p$i/log.jsonl")
    [ "$batches" -eq $((steps + 1)) ] || fail "p$i: $batches batches for $steps delayed steps"
done
loss_goes_down p0 8 0.85

# 2. free-running
steps=30
args=(--model resnet14 --epochs 100 --batch-size 16 --opt sgd --lr 0.1 --no-progress --print-freq 1
      --threads 1 --max-steps "$steps" --seed 5 --target-batch-size 96 --group-size 3
      --matchmaking-time 2 --delay-updates --swarm-verbose)
boot delay-free
start_peers delay-free f 3 400 "${args[@]}"
# peer 2 (visc, the child of timeout) runs at half speed: stopped 100 ms
# out of every 200
slow=
for _ in $(seq 50); do slow=$(pgrep -P "${ps[2]}") && break; sleep 0.1; done
[ -n "$slow" ] || fail "no visc process under f2's timeout"
( while [ -n "$slow" ] && kill -0 "$slow" 2>/dev/null; do
      sleep 0.1; kill -STOP "$slow" 2>/dev/null; sleep 0.1; kill -CONT "$slow" 2>/dev/null
  done ) &
pids+=($!)
for i in 0 1 2; do exits_cleanly "f$i" "${ps[$i]}" 400; done
for i in 1 2; do same_params f0 "f$i"; done
for i in 0 1 2; do
    grep -q "swarm: $steps steps, .* 0 local," "$tmp/f$i.log" ||
        fail "f$i: $(grep 'steps,' "$tmp/f$i.log")"
    ! grep -q "taken alone" "$tmp/f$i.log" || fail "f$i stepped alone"
    overlap=$(sed -n 's/.*--delay-updates: \([0-9]*\) samples computed.*/\1/p' "$tmp/f$i.log")
    [ "${overlap:-0}" -gt 0 ] || fail "f$i computed nothing while its rounds ran (${overlap:-no line})"
    echo "f$i: $(grep 'steps,' "$tmp/f$i.log" | sed 's/^visc: swarm: //'); $overlap samples overlapped"
done
loss_goes_down f0 20 0.9

[ $fails -eq 0 ] && echo "swarm delayed updates: all checks passed"
exit $((fails > 0))
