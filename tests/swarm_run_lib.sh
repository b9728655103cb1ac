# shellcheck shell=bash
# swarm_run_lib.sh: what the e2e scripts that run `visc` peers share
# (sourced, not run): a temporary folder removed at exit with every process
# in $pids killed with its children (SIGKILL), fail() counting failures in $fails, the run's
# shared secret in $tmp/secret, and:
#   boot RUN        a standing `visc swarm node` for the run's peers (a DHT
#                   network is one run's); sets $boot to its host:port
#   lingering LOG.. waits (up to 120 s) until every peer whose output is
#                   $tmp/LOG.log is done and serving its state
#                   (--swarm-linger); a failure otherwise
#   wait_bounded S PID  the exit status of PID (a child of this shell), or
#                   124 after S seconds (PID killed)
#   start_peers RUN NAME N S ARGS..  N `visc train ARGS` peers of run RUN
#                   joining through $boot, peer i on shard i/N with its
#                   output in $tmp/NAMEi, log $tmp/NAMEi.log and key
#                   $tmp/NAMEi.key, each stopped by timeout(1) after S
#                   seconds; their PIDs in $ps (and $pids)
V=${VISC:-build/visc}
tmp=$(mktemp -d)
pids=()
# A peer started as `f ... &` is a subshell whose child is timeout(1) or
# visc: killing $! alone would orphan them, so whole trees go.
kill_tree() {
    local p c
    for p in "$@"; do
        for c in $(ps -o pid= --ppid "$p" 2>/dev/null); do kill_tree "$c"; done
        kill -9 "$p" 2>/dev/null
    done
}
cleanup() { kill_tree "${pids[@]}"; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
head -c 32 /dev/urandom >"$tmp/secret"; chmod 600 "$tmp/secret"

boot() {
    "$V" swarm node --run-id "$1" --key "$tmp/boot.key" --swarm-secret-file "$tmp/secret" \
        --listen 127.0.0.1:0 >"$tmp/boot-$1.out" 2>&1 &
    pids+=($!)
    for _ in $(seq 100); do grep -qs "DHT port" "$tmp/boot-$1.out" && break; sleep 0.1; done
    # shellcheck disable=SC2034 # read by the scripts that source this file
    boot=127.0.0.1:$(sed -n 's/.*DHT port \([0-9]*\);.*/\1/p' "$tmp/boot-$1.out")
}

lingering() {
    local log
    for log in "$@"; do
        for _ in $(seq 1200); do grep -qs "serving the state" "$tmp/$log.log" && break; sleep 0.1; done
        grep -qs "serving the state" "$tmp/$log.log" || { fail "$log never finished"; return 1; }
    done
}

wait_bounded() {
    local end=$(($(date +%s) + $1))
    while kill -0 "$2" 2>/dev/null; do
        if [ "$(date +%s)" -ge "$end" ]; then
            kill -9 "$2" 2>/dev/null
            wait "$2" 2>/dev/null
            return 124
        fi
        sleep 0.1
    done
    wait "$2"
}

start_peers() {
    local run=$1 name=$2 n=$3 limit=$4 i
    shift 4
    ps=()
    for ((i = 0; i < n; i++)); do
        timeout "$limit" "$V" train "$@" --swarm-shard "$i/$n" --output "$tmp/$name$i" --swarm \
            --run-id "$run" --key "$tmp/$name$i.key" --swarm-secret-file "$tmp/secret" \
            --listen 127.0.0.1:0 --initial-peers "$boot" >"$tmp/$name$i.log" 2>&1 &
        ps+=($!)
        pids+=($!)
    done
}
