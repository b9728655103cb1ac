#!/usr/bin/env bash
# The study of issue 8 (docs/swarm_study.md): for collaborative training
# over a swarm, is large-batch LAMB with gradient averaging or parameter
# averaging (local AdamW updates) better? On Fashion-MNIST with a ResNet-14,
# four loopback peers of unequal speed against single-process baselines,
# with the same number of training samples everywhere.
#
#   VISC=build/visc bash tools/study/swarm_study.sh [OUT_DIR] [DOC_DIR]
#
# OUT_DIR (default runs/swarm_study) gets one folder per configuration
# (each peer's run folder, stdout/stderr, its log.jsonl with wall-clock
# stamps, the final evaluation), load.txt (the load average every 5 s) and
# summary.md/summary.json; DOC_DIR (default docs) gets the PNG plots
# (tools/study/swarm_plot.py, python3-matplotlib).
#
# Environment knobs (defaults in brackets): EPOCHS [1] training samples as
# epochs of the 60,000 images; TARGET [1024] the swarm's target batch;
# PEER_BATCH [64]; LAMB_LR [0.02]; ADAMW_LR [0.001]; CONFIGS [base_lamb
# grad_lamb grad_lamb_fp16 grad_lamb_q8 base_adamw param_adamw
# param_adamw_q8; also param_adamw_fp16, and grad_lamb_equal and
# param_adamw_equal: four peers of equal speed (none duty-cycled)];
# PLOT_CONFIGS [CONFIGS] the runs under OUT_DIR to tabulate and plot;
# MAX_STEPS [unset] a pilot of this many global steps; RUN_LIMIT [1200]
# seconds before a configuration is killed (and reported failed); EVAL_EVERY
# [6] peer 0 (and each baseline, at as many samples) evaluates on the test
# set every this many global steps (--eval-interval; 0: epoch ends only).
#
# Unequal speed without source changes: every peer runs one compute thread,
# and peer i is duty-cycled by this script with SIGSTOP/SIGCONT: stopped
# STOP_MS[i] out of every 200 ms (0, 50, 100, 150: nominal speeds 1, 3/4,
# 1/2, 1/4). The machine's other load shifts the real speeds; each peer's
# measured share of the samples is in the summary.
set -uo pipefail
V=${VISC:-build/visc}
OUT=${1:-runs/swarm_study}
DOC=${2:-docs}
EPOCHS=${EPOCHS:-1}
TARGET=${TARGET:-1024}
PEER_BATCH=${PEER_BATCH:-64}
LAMB_LR=${LAMB_LR:-0.02}
ADAMW_LR=${ADAMW_LR:-0.001}
RUN_LIMIT=${RUN_LIMIT:-1200}
EVAL_EVERY=${EVAL_EVERY:-6}
CONFIGS=${CONFIGS:-base_lamb grad_lamb grad_lamb_fp16 grad_lamb_q8 base_adamw param_adamw param_adamw_q8}
PERIOD_MS=200
STOP_MS=(0 50 100 150)
TRAIN_SIZE=60000

[ -x "$V" ] || { echo "swarm_study: no visc binary at $V (set VISC=)" >&2; exit 2; }
mkdir -p "$OUT" "$DOC" || exit 2
OUT=$(cd "$OUT" && pwd)
tmp=$(mktemp -d)
bg=() # background helpers (load sampler, log stampers, duty cyclers, node)
cleanup() {
    for f in "$tmp"/*.pid; do
        [ -e "$f" ] || continue
        kill -CONT "$(cat "$f")" 2>/dev/null
        kill -9 "$(cat "$f")" 2>/dev/null
    done
    [ ${#bg[@]} -gt 0 ] && kill "${bg[@]}" 2>/dev/null
    wait 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
head -c 32 /dev/urandom >"$tmp/secret"
chmod 600 "$tmp/secret"

# global steps for EPOCHS epochs: the trainer's schedule has
# ceil(train size / target) steps per epoch
STEPS=$((EPOCHS * ((TRAIN_SIZE + TARGET - 1) / TARGET)))
# a pilot: MAX_STEPS global steps (the baselines stop at as many samples)
pilot=()
[ -n "${MAX_STEPS:-}" ] && STEPS=$MAX_STEPS

common=(--model resnet14 --dataset fashion-mnist --seed 0 --no-progress --workers 1
        --sched constant --warmup-epochs 0.3 --pad-crop 2 --hflip --print-freq 5)
lamb=(--opt lamb --lr "$LAMB_LR" --wd 0.01)
adamw=(--opt adamw --lr "$ADAMW_LR" --wd 0.05)

( while :; do echo "$(date +%s.%N) $(cat /proc/loadavg)"; sleep 5; done >>"$OUT/load.txt" ) &
bg+=($!)

# launch NAME DIR args...: one visc process in the background (its wrapper
# shell in $launched; not under $(...), whose pipe the children would hold
# open); the visc pid in $tmp/NAME.pid, its exit status and end time in DIR/NAME.end, its
# log.jsonl copied line by line with a wall-clock stamp into DIR/NAME.tlog
launch() {
    local name=$1 dir=$2
    shift 2
    rm -f "$tmp/$name.pid"
    (
        "$V" "$@" >"$dir/$name.out" 2>"$dir/$name.err" &
        echo $! >"$tmp/$name.pid"
        date +%s.%N >"$dir/$name.start"
        wait $!
        echo "$? $(date +%s.%N)" >"$dir/$name.end"
    ) &
    local wrapper=$!
    for _ in $(seq 100); do [ -s "$tmp/$name.pid" ] && break; sleep 0.05; done
    ( tail -n +1 -s 0.2 -F --pid=$wrapper "$dir/$name/log.jsonl" 2>/dev/null |
        while IFS= read -r l; do echo "$(date +%s.%N) $l"; done >"$dir/$name.tlog" ) &
    bg+=($!)
    launched=$wrapper
}

# duty NAME STOP_MS: stop the process STOP_MS out of every PERIOD_MS
duty() {
    local pid stop_s run_s
    pid=$(cat "$tmp/$1.pid")
    stop_s=$(awk -v s="$2" 'BEGIN { printf "%.3f", s / 1000 }')
    run_s=$(awk -v s="$2" -v p=$PERIOD_MS 'BEGIN { printf "%.3f", (p - s) / 1000 }')
    while kill -0 "$pid" 2>/dev/null; do
        sleep "$run_s"
        kill -STOP "$pid" 2>/dev/null || break
        sleep "$stop_s"
        kill -CONT "$pid" 2>/dev/null
    done
}

# wait_all LIMIT_S WRAPPER...: 0 when all ended in time, else kills them
wait_all() {
    local limit=$1 t0 w
    shift
    t0=$(date +%s)
    for w in "$@"; do
        while kill -0 "$w" 2>/dev/null; do
            if [ $(($(date +%s) - t0)) -ge "$limit" ]; then
                echo "  time limit ($limit s) reached: killing the run"
                for f in "$tmp"/*.pid; do
                    kill -CONT "$(cat "$f")" 2>/dev/null
                    kill -9 "$(cat "$f")" 2>/dev/null
                done
                wait "$@" 2>/dev/null
                return 1
            fi
            sleep 0.5
        done
    done
    wait "$@" 2>/dev/null
    return 0
}

# final_eval DIR RUN: top-1 of RUN's model_last on the test set
final_eval() {
    "$V" train --model resnet14 --dataset fashion-mnist --threads 2 --evaluate \
        --weights "$1/$2/model_last.safetensors" --output "$1/eval-$2" >"$1/eval-$2.out" 2>&1
}

# baseline NAME BATCH OPT...: one process, both cores
baseline() {
    local name=$1 batch=$2 dir="$OUT/$1"
    shift 2
    rm -rf "$dir"
    mkdir -p "$dir"
    echo "$name: one process, batch $batch, $EPOCHS epochs"
    printf '%s\n' "${common[@]}" "$@" --threads 2 --batch-size "$batch" --epochs "$EPOCHS" >"$dir/flags"
    uptime >"$dir/uptime"
    [ -n "${MAX_STEPS:-}" ] && pilot=(--max-steps $((MAX_STEPS * TARGET / batch)))
    local ev=()
    [ "$EVAL_EVERY" -gt 0 ] && ev=(--eval-interval $((EVAL_EVERY * TARGET / batch)))
    launch p0 "$dir" train "${common[@]}" "$@" --threads 2 --batch-size "$batch" \
        --epochs "$EPOCHS" "${pilot[@]}" "${ev[@]}" --output "$dir/p0"
    wait_all "$RUN_LIMIT" "$launched" || echo "failed" >"$dir/FAILED"
    uptime >>"$dir/uptime"
    final_eval "$dir" p0
    grep -h "evaluate" "$dir/eval-p0.out" | tail -1
}

# swarm NAME MODE COMPRESSION OPT...: four duty-cycled peers (a NAME that
# ends in _equal: none is stopped, the control for the unequal speeds)
swarm() {
    local name=$1 mode=$2 comp=$3 dir="$OUT/$1" stops=("${STOP_MS[@]}")
    shift 3
    [[ $name == *_equal ]] && stops=(0 0 0 0)
    rm -rf "$dir"
    mkdir -p "$dir"
    echo "$name: 4 peers, --averaging $mode --compression $comp, target batch $TARGET, $STEPS steps"
    "$V" swarm node --run-id "$name" --key "$tmp/boot.key" --swarm-secret-file "$tmp/secret" \
        --listen 127.0.0.1:0 >"$dir/boot.out" 2>&1 &
    local node=$!
    bg+=("$node")
    for _ in $(seq 100); do grep -qs "DHT port" "$dir/boot.out" && break; sleep 0.1; done
    local boot
    boot=127.0.0.1:$(sed -n 's/.*DHT port \([0-9]*\);.*/\1/p' "$dir/boot.out")
    local flags=("${common[@]}" "$@" --threads 1 --batch-size "$PEER_BATCH" --epochs 1000
                 --max-steps "$STEPS" --swarm --run-id "$name" --swarm-secret-file "$tmp/secret"
                 --listen 127.0.0.1:0 --initial-peers "$boot" --target-batch-size "$TARGET"
                 --averaging "$mode" --compression "$comp" --group-size 4
                 --matchmaking-time 2)
    printf '%s\n' "${flags[@]}" >"$dir/flags"
    uptime >"$dir/uptime"
    local ws=() i
    for i in 0 1 2 3; do
        local ev=()
        [ "$i" = 0 ] && [ "$EVAL_EVERY" -gt 0 ] && ev=(--eval-interval "$EVAL_EVERY")
        launch "p$i" "$dir" train "${flags[@]}" "${ev[@]}" --swarm-shard "$i/4" --key "$tmp/$name-$i.key" \
            --output "$dir/p$i"
        ws+=("$launched")
    done
    for i in 1 2 3; do
        [ "${stops[$i]}" -gt 0 ] || continue
        duty "p$i" "${stops[$i]}" &
        bg+=($!)
    done
    wait_all "$RUN_LIMIT" "${ws[@]}" || echo "failed" >"$dir/FAILED"
    uptime >>"$dir/uptime"
    kill "$node" 2>/dev/null
    for i in 0 1 2 3; do
        grep -h "visc: swarm:" "$dir/p$i.err" | grep -v "^visc: swarm: [0-9]* steps" |
            sed "s/^/p$i: /" >>"$dir/swarm_events.txt"
        grep -h "^visc: swarm: [0-9]* steps" "$dir/p$i.err" | sed "s/^/p$i: /"
        [ "$i" -gt 0 ] && { "$V" diff "$dir/p0/model_last.safetensors" \
            "$dir/p$i/model_last.safetensors" --rtol 0 --atol 0 >"$dir/diff-p$i.txt" 2>&1; }
    done
    [ -s "$dir/swarm_events.txt" ] && echo "  $(wc -l <"$dir/swarm_events.txt") swarm event lines (swarm_events.txt)"
    # every peer's final model: they should be one, but may not be
    for i in 0 1 2 3; do
        final_eval "$dir" "p$i"
        echo "  p$i: $(grep -h "evaluate" "$dir/eval-p$i.out" | tail -1)"
    done
}

echo "swarm study: $V, out $OUT, $EPOCHS epochs ($STEPS steps of $TARGET in the swarm), $(nproc) cores"
uptime
for cfg in $CONFIGS; do
    case $cfg in
    base_lamb) baseline base_lamb "$TARGET" "${lamb[@]}" ;;
    base_adamw) baseline base_adamw "$PEER_BATCH" "${adamw[@]}" ;;
    grad_lamb) swarm grad_lamb gradients none "${lamb[@]}" ;;
    grad_lamb_fp16) swarm grad_lamb_fp16 gradients fp16 "${lamb[@]}" ;;
    grad_lamb_q8) swarm grad_lamb_q8 gradients q8 "${lamb[@]}" ;;
    param_adamw) swarm param_adamw parameters none "${adamw[@]}" ;;
    param_adamw_fp16) swarm param_adamw_fp16 parameters fp16 "${adamw[@]}" ;;
    param_adamw_q8) swarm param_adamw_q8 parameters q8 "${adamw[@]}" ;;
    grad_lamb_equal) swarm grad_lamb_equal gradients none "${lamb[@]}" ;;
    param_adamw_equal) swarm param_adamw_equal parameters none "${adamw[@]}" ;;
    *) echo "swarm_study: unknown configuration '$cfg'" >&2; exit 2 ;;
    esac
done
uptime
# the plotting helper needs matplotlib: the first python that has it
py=
for p in ${PYTHON:-} python3 /usr/bin/python3; do
    "$p" -c "import matplotlib" 2>/dev/null && { py=$p; break; }
done
[ -n "$py" ] || { echo "swarm_study: no python3 with matplotlib (apt-get install python3-matplotlib)" >&2; exit 2; }
# shellcheck disable=SC2086 # the configuration names are words
"$py" "$(dirname "$0")/swarm_plot.py" --out "$OUT" --doc "$DOC" --target "$TARGET" \
    --peer-batch "$PEER_BATCH" --print-freq 5 --train-size "$TRAIN_SIZE" \
    --configs ${PLOT_CONFIGS:-$CONFIGS}
