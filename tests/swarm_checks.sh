# shellcheck shell=bash
# swarm_checks.sh: checks on swarm training peers and the models they
# saved, for the e2e_swarm_*.sh scripts (sourced, not run). They use $V
# (visc), $tmp (the peers' logs and output folders) and fail() of the script.
#
#   exits_cleanly NAME PID [SECS]
#                       the peer (a child of the script, its output in
#                       $tmp/NAME.log) exits by itself within SECS (default
#                       240: its steps and --swarm-linger), with status 0 and
#                       no sanitizer report; killed and a failure otherwise.
#                       (A peer that exits writes its coverage counters too.)
#   same_params A B     A and B (peer names: $tmp/A/model_last.safetensors)
#                       hold the same parameters, bit for bit, but for
#                       BatchNorm's num_batches_tracked: each peer counts the
#                       batches it ran itself (the running statistics are
#                       averaged with the gradients)
#   loss_goes_down NAME K FRACTION
#                       NAME's log.jsonl has the running mean m_k of its
#                       epoch's batch losses at every batch (--print-freq 1);
#                       the batch losses are k m_k - (k-1) m_(k-1). The mean
#                       of the last K must be below FRACTION x the mean of
#                       the first K.

same_params() {
    "$V" diff "$tmp/$1/model_last.safetensors" "$tmp/$2/model_last.safetensors" --rtol 0 --atol 0 \
        >"$tmp/diff-$1-$2" 2>&1
    local others
    others=$(grep "^differs:" "$tmp/diff-$1-$2" | grep -cv "num_batches_tracked")
    [ "$others" -eq 0 ] && grep -q "^[1-9][0-9]* tensors" "$tmp/diff-$1-$2" ||
        { cat "$tmp/diff-$1-$2"; fail "$1 and $2 ended with different parameters"; }
}

loss_goes_down() {
    local name=$1 k=$2 frac=$3 first last
    sed -n 's/.*"type":"train".*"loss":\([0-9.]*\),.*/\1/p' "$tmp/$name/log.jsonl" >"$tmp/losses-$name"
    read -r first last < <(awk -v K="$k" '{ n++; l[n] = n * $1 - (n - 1) * prev; prev = $1 }
        END { for (i = 1; i <= K; i++) { a += l[i]; b += l[n - K + i] } print a / K, b / K }' \
        "$tmp/losses-$name")
    echo "$name: batch loss $first over its first $k batches, $last over its last $k"
    awk -v a="$first" -v b="$last" -v f="$frac" 'BEGIN { exit !(b < f * a) }' ||
        fail "$name: the loss did not go down"
}

exits_cleanly() {
    local name=$1 pid=$2 secs=${3:-240} rc
    for _ in $(seq $((secs * 10))); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        kill -9 "$pid" 2>/dev/null
        tail -5 "$tmp/$name.log"
        fail "$name still running after $secs s (killed)"
        return 1
    fi
    wait "$pid"
    rc=$?
    [ "$rc" -eq 0 ] || { tail -5 "$tmp/$name.log"; fail "$name exited with status $rc"; }
    ! grep -q "Sanitizer\|runtime error" "$tmp/$name.log" ||
        { grep -A5 "Sanitizer\|runtime error" "$tmp/$name.log"; fail "$name: sanitizer report"; }
}
