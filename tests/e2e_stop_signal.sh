#!/usr/bin/env bash
# A signal stops a run after its step, with a checkpoint (stop_signal.c):
# Ctrl-C, a scheduler's SIGTERM, mpirun's forwarded SIGUSR1.
#   - visc train, SIGTERM: exit status 143, one line naming the step and
#     the --resume that goes on; the checkpoint is the one a run of that
#     many steps without the signal writes, bit for bit (so resuming it is
#     the uninterrupted run: e2e_resume.sh);
#   - visc pretrain (MoCo v2), SIGINT: 130, the same;
#   - 2 ranks under mpirun, SIGUSR1 to rank 1 alone: both stop after the
#     same step (a rank that stopped alone would leave the other waiting in
#     its next all-reduce), rank 0 saves, exit status 138.
set -euo pipefail
V=${VISC:-build/visc}
source tests/lib.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export VISC_CACHE_DIR="$tmp/cache"
fail() { echo "FAIL: $*"; exit 1; }

# wait_steps LOG N: until LOG holds N training reports (at most 120 s)
wait_steps() {
    for _ in $(seq 1200); do
        [ "$(cat "$1" 2>/dev/null | grep -c '"type":"train"')" -ge "$2" ] && return 0
        sleep 0.1
    done
    fail "no $2 steps in $1"
}
# stopped_at LOG SIGNAL: the step the run's closing line names
stopped_at() { sed -n "s/^stopped by $2 after step \([0-9]*\); --resume .*checkpoint_last.safetensors goes on$/\1/p" "$1"; }

# stops_cleanly NAME SIGNAL STATUS STEPS ARGS...: `visc ARGS` sent SIGNAL
# once STEPS steps are logged ends with STATUS and the closing line, its
# checkpoint that of `visc ARGS --max-steps n` for the n it names
stops_cleanly() {
    local name=$1 sig=$2 want=$3 steps=$4 rc=0 n pid
    shift 4
    "$V" "$@" --output "$tmp/$name" >"$tmp/$name.log" 2>"$tmp/$name.err" &
    pid=$!
    wait_steps "$tmp/$name/log.jsonl" "$steps"
    kill -"$sig" $pid
    timeout 120 tail --pid=$pid -f /dev/null || fail "$name: still running 120 s after SIG$sig"
    wait $pid || rc=$?
    [ $rc -eq "$want" ] || { cat "$tmp/$name.log" "$tmp/$name.err"; fail "$name: exit status $rc, not $want"; }
    n=$(stopped_at "$tmp/$name.log" "SIG$sig")
    [ -n "$n" ] && [ "$n" -ge "$steps" ] || { cat "$tmp/$name.log"; fail "$name: no closing line"; }
    "$V" "$@" --max-steps "$n" --output "$tmp/$name-straight" >/dev/null
    cmp <(tensors "$tmp/$name/checkpoint_last.safetensors") \
        <(tensors "$tmp/$name-straight/checkpoint_last.safetensors") ||
        fail "$name: the checkpoint after SIG$sig at step $n is not the $n-step run's"
    echo "visc $1, SIG$sig after step $n: exit $want, the $n-step checkpoint bit for bit"
}

train=(--model resnet14 --epochs 3 --batch-size 32 --print-freq 1 --no-progress --threads 2)
stops_cleanly train TERM 143 5 train "${train[@]}"
cifar_subset "$tmp/data" 20 10
ssl=(--data "imagenet:$tmp/data" --model resnet14 --width 16 --input-size 32 --crop-pct 1
     --batch-size 20 --bank-size 100 --seed 3 --epochs 4 --no-progress --print-freq 1 --workers 2)
stops_cleanly pretrain INT 130 3 pretrain "${ssl[@]}"

# --- 2 ranks, SIGUSR1 to rank 1 alone ---
"${MPI[@]}" "$V" train "${train[@]}" --batch-size 16 --output "$tmp/usr1" \
    >"$tmp/usr1.log" 2>"$tmp/usr1.err" &
pid=$!
wait_steps "$tmp/usr1/log.jsonl" 5
r1=$(rank1_of "$tmp/usr1") || fail "mpirun: no rank 1"
kill -USR1 "$r1"
rc=0
timeout 120 tail --pid=$pid -f /dev/null || fail "mpirun: still running 120 s after the signal"
wait $pid || rc=$?
[ $rc -eq 138 ] || { cat "$tmp/usr1.log" "$tmp/usr1.err"; fail "mpirun: exit status $rc, not 138"; }
n=$(stopped_at "$tmp/usr1.log" SIGUSR1)
[ -n "$n" ] && [ -e "$tmp/usr1/checkpoint_last.safetensors" ] ||
    { cat "$tmp/usr1.log" "$tmp/usr1.err"; fail "mpirun: no closing line or checkpoint"; }
echo "2 ranks, SIGUSR1 to rank 1: both stopped after step $n, exit 138, checkpoint saved"
