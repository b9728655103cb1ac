#!/usr/bin/env bash
# REPRODUCTION of the open part of issue 8, not a test of the suite: at
# full speed (`VISC=build/visc bash tools/repro/swarm_churn.sh`) it passes,
# but with every peer several times slower (the coverage build:
# VISC=build-cov/visc) a newcomer can stay behind for good and the
# survivors end with different parameters. It moves back to tests/ once
# the swarm stays one model there too.
# Churn: six peer processes train a small ResNet on Fashion-MNIST as one
# swarm (free-running: a step whenever the swarm has processed its target
# batch) while peers are killed (SIGKILL) and newcomers join. Training must
# go on, the loss must go down, each newcomer must take the swarm's state
# and then take part in steps, and every surviving peer must end with the
# same parameters, bit for bit; no process may crash or hang.
set -uo pipefail
V=${VISC:-build/visc}
tmp=$(mktemp -d)
pids=()
cleanup() { kill -9 "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
head -c 32 /dev/urandom >"$tmp/secret"; chmod 600 "$tmp/secret"

"$V" swarm node --run-id churn --key "$tmp/boot.key" --swarm-secret-file "$tmp/secret" \
    --listen 127.0.0.1:0 >"$tmp/boot.out" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -qs "DHT port" "$tmp/boot.out" && break; sleep 0.1; done
boot=127.0.0.1:$(sed -n 's/.*DHT port \([0-9]*\);.*/\1/p' "$tmp/boot.out")

steps=24
args=(--model resnet14 --epochs 1 --batch-size 16 --opt sgd --lr 0.05 --no-progress --print-freq 1
      --threads 1 --max-steps $steps --swarm --run-id churn --swarm-secret-file "$tmp/secret"
      --listen 127.0.0.1:0 --initial-peers "$boot" --target-batch-size 64 --matchmaking-time 2
      --swarm-linger 120)
declare -A pid
start() { # start NAME SEED SHARD
    # not under timeout(1): SIGKILL must reach visc itself (cleanup bounds the run)
    "$V" train "${args[@]}" --seed "$2" --swarm-shard "$3" --key "$tmp/$1.key" \
        --output "$tmp/$1" >"$tmp/$1.log" 2>&1 &
    pid[$1]=$!
    pids+=($!)
}
# the global step a peer has reached (its last logged training step)
step_of() { sed -n 's/.*"type":"train".*"step":\([0-9]*\),.*/\1/p' "$tmp/$1/log.jsonl" 2>/dev/null | tail -1; }
wait_step() { # wait_step NAME STEP: until the peer has logged that step (bounded)
    for _ in $(seq 1200); do
        [ "$(step_of "$1")" -ge "$2" ] 2>/dev/null && return 0
        sleep 0.1
    done
    fail "$1 did not reach step $2 within 120 s"; return 1
}

for i in 0 1 2 3; do start p$i 3 $i/6; done
wait_step p0 5
kill -9 "${pid[p1]}"; echo "step $(step_of p0): killed p1; p4 joins"
start p4 99 4/6
wait_step p0 12
kill -9 "${pid[p2]}"; echo "step $(step_of p0): killed p2; p5 joins"
start p5 98 5/6

survivors=(p0 p3 p4 p5)
for p in "${survivors[@]}"; do
    for _ in $(seq 2400); do
        grep -q "serving the state" "$tmp/$p.log" && break
        kill -0 "${pid[$p]}" 2>/dev/null || break
        sleep 0.1
    done
    grep -q "serving the state" "$tmp/$p.log" || { tail -5 "$tmp/$p.log"; fail "$p did not finish its $steps steps"; }
done
for p in "${survivors[@]}"; do grep "swarm: [0-9]* steps" "$tmp/$p.log" | sed "s/^/$p: /"; done
# bit for bit, but for BatchNorm's num_batches_tracked: each peer counts
# the batches it ran itself (the running statistics are averaged)
for p in p3 p4 p5; do
    "$V" diff "$tmp/p0/model_last.safetensors" "$tmp/$p/model_last.safetensors" --rtol 0 --atol 0 \
        >"$tmp/diff-$p" 2>&1
    others=$(grep "^differs:" "$tmp/diff-$p" | grep -cv "num_batches_tracked")
    [ "$others" -eq 0 ] && grep -q "^92 tensors" "$tmp/diff-$p" ||
        { cat "$tmp/diff-$p"; fail "p0 and $p ended with different parameters"; }
done
for p in p4 p5; do
    grep -q "[1-9][0-9]* state downloads" "$tmp/$p.log" || fail "newcomer $p took no state"
    grep -q "swarm: [0-9]* steps, [1-9][0-9]* rounds ([0-9]* failed" "$tmp/$p.log" ||
        fail "newcomer $p took part in no round"
done
# the loss goes down: p0's log has the running mean of its epoch's batch
# losses at every batch; the batch losses are k m_k - (k-1) m_(k-1). The
# mean of the last 8 must be below 85% of the mean of the first 8.
sed -n 's/.*"type":"train".*"loss":\([0-9.]*\),.*/\1/p' "$tmp/p0/log.jsonl" >"$tmp/losses"
read -r first last < <(awk '{ k++; l[k] = k * $1 - (k - 1) * prev; prev = $1 }
    END { for (i = 1; i <= 8; i++) { a += l[i]; b += l[k - 8 + i] } print a / 8, b / 8 }' "$tmp/losses")
echo "p0: batch loss $first over its first 8 batches, $last over its last 8"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < 0.85 * a) }' || fail "the loss did not go down"

[ $fails -eq 0 ] && echo "swarm churn: all checks passed"
exit $((fails > 0))
