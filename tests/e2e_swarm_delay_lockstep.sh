#!/usr/bin/env bash
# Delayed parameter updates (`--delay-updates`) in lockstep: a step's
# all-reduce runs in the background while the next batch is computed, and
# its mean gradient is applied one step late. No exact reference: one
# process has no delayed-gradient mode. Three peers (batch 16 on their
# shards i/3) end bit-identical to each other, every round averaged, the
# loss goes down, and each peer computed one batch more than its steps
# (the first batch's round is applied after the second batch).
# The free-running mode: e2e_swarm_delay.sh. (Two scripts because this one
# mostly waits for its rounds, 8 s of CPU in 48 s, and so runs beside the
# other waiting tests, tests/concurrent_tests; the free-running peers
# compute all the time.)
set -uo pipefail
source tests/swarm_run_lib.sh
source tests/swarm_checks.sh

steps=40
args=(--model resnet14 --epochs 1 --batch-size 16 --opt sgd --lr 0.1 --no-progress --print-freq 1
      --threads 1 --max-steps "$steps" --seed 5 --target-batch-size 48 --lockstep --group-size 3
      --matchmaking-time 5 --delay-updates --swarm-verbose)
boot delay
ps=()
for i in 0 1 2; do
    timeout 400 "$V" train "${args[@]}" --swarm-shard "$i/3" --output "$tmp/p$i" --swarm \
        --run-id delay --key "$tmp/p$i.key" --swarm-secret-file "$tmp/secret" \
        --listen 127.0.0.1:0 --initial-peers "$boot" >"$tmp/p$i.log" 2>&1 &
    ps+=($!)
done
for i in 0 1 2; do exits_cleanly "p$i" "${ps[$i]}" 400; done
for i in 1 2; do same_params p0 "p$i"; done
for i in 0 1 2; do
    grep -q "swarm: $steps steps, $steps rounds (0 failed, 0 partial), 0 skipped" "$tmp/p$i.log" ||
        fail "p$i: $(grep 'steps,' "$tmp/p$i.log")"
    batches=$(grep -c '"type":"train"' "$tmp/p$i/log.jsonl")
    [ "$batches" -eq $((steps + 1)) ] || fail "p$i: $batches batches for $steps delayed steps"
done
loss_goes_down p0 8 0.85

[ $fails -eq 0 ] && echo "swarm delayed updates in lockstep: all checks passed"
exit $((fails > 0))
