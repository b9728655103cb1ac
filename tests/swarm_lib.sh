# shellcheck shell=bash
# swarm_lib.sh: one all-reduce round among swarm_peer processes on
# loopback, for the e2e_swarm_*.sh scripts (sourced, not run).
#
#   swarm_round NAME N COMPRESSION "CHECK FLAGS" MEMBER...
# MEMBER is role:weight:bandwidth:fault (role full or client; fault as
# swarm_peer --fault). Every member gets a key; the allowlist holds all of
# them but an unknown-key peer's; all share a secret but a no-secret peer.
# The peers start, publish their addresses, the script writes the group
# file (members in the order given), every peer runs one round, and
# swarm_peer --check verifies the honest peers' outputs against the exact
# weighted mean of the inputs the reports say were used. Extra peer flags:
# $SWARM_PEER_FLAGS. Returns non-zero on any failure.
set -u
peer_bin=${PEER_BIN:-build/tests/swarm_peer}
[ -x "$peer_bin" ] || { echo "no $peer_bin: the swarm is not built (make tests, SWARM=1)"; exit 1; }
swarm_tmp=$(mktemp -d /tmp/visc_swarm.XXXXXX)
swarm_pids=()
swarm_cleanup() {
    local p
    for p in "${swarm_pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$swarm_tmp"
}
trap swarm_cleanup EXIT

# wait_bounded SECONDS PID: the exit status of PID, a child of this shell;
# killed and 124 when it runs longer
wait_bounded() {
    local end=$(($(date +%s) + $1))
    while kill -0 "$2" 2>/dev/null; do
        if [ "$(date +%s)" -ge "$end" ]; then
            kill -9 "$2" 2>/dev/null; { wait "$2"; } 2>/dev/null
            echo "pid $2 still running after $1 s: killed"; return 124
        fi
        sleep 0.05
    done
    wait "$2"
}

# wait_for_files SECONDS FILE...: 0 when all exist in time
wait_for_files() {
    local limit=$1 f end
    shift
    end=$(($(date +%s) + limit))
    for f in "$@"; do
        while [ ! -f "$f" ]; do
            [ "$(date +%s)" -ge "$end" ] && { echo "missing $f after ${limit}s"; return 1; }
            sleep 0.05
        done
    done
}

swarm_round() {
    local name=$1 n=$2 comp=$3 check=$4
    shift 4
    local d="$swarm_tmp/$name" m=$# i spec role weight bw fault
    mkdir -p "$d"
    head -c 32 /dev/urandom >"$d/secret" && chmod 600 "$d/secret"
    : >"$d/allow"
    i=0
    for spec in "$@"; do
        IFS=: read -r role weight bw fault <<<"$spec"
        pk=$("$peer_bin" --keygen "$d/key$i") || return 1
        [ "$fault" = unknown-key ] || echo "$pk" >>"$d/allow"
        i=$((i + 1))
    done
    local pids=() addrs=()
    i=0
    for spec in "$@"; do
        IFS=: read -r role weight bw fault <<<"$spec"
        local extra=()
        [ "$role" = client ] && extra+=(--client)
        # shellcheck disable=SC2086 # the extra flags are words
        "$peer_bin" --key "$d/key$i" --secret "$d/secret" --allow "$d/allow" \
            --addr-out "$d/addr$i" --group "$d/group" --out "$d/out$i" --n "$n" \
            --seed $((1000 + i)) --weight "$weight" --bandwidth "$bw" --compression "$comp" \
            --fault "$fault" ${SWARM_PEER_FLAGS:-} "${extra[@]}" 2>"$d/log$i" &
        pids+=($!)
        swarm_pids+=($!)
        addrs+=("$d/addr$i")
        i=$((i + 1))
    done
    wait_for_files 30 "${addrs[@]}" || return 1
    {
        head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n'
        echo
        i=0
        for spec in "$@"; do
            IFS=: read -r role weight bw fault <<<"$spec"
            read -r pk addr _ <"$d/addr$i"
            echo "$pk $addr $bw $([ "$role" = client ] && echo 1 || echo 0)"
            i=$((i + 1))
        done
    } >"$d/group.tmp" && mv "$d/group.tmp" "$d/group"
    # honest peers must finish by themselves; then the stalled ones are killed
    local rc=0 members="$d/members"
    : >"$members"
    i=0
    for spec in "$@"; do
        IFS=: read -r role weight bw fault <<<"$spec"
        if [ "$fault" = none ]; then
            if ! wait_bounded 60 "${pids[$i]}"; then
                echo "$name: peer $i failed:"; cat "$d/log$i"; rc=1
            fi
            echo "$i $((1000 + i)) $weight $d/out$i" >>"$members"
        else
            echo "$i $((1000 + i)) $weight -" >>"$members"
        fi
        i=$((i + 1))
    done
    for i in "${!pids[@]}"; do kill -9 "${pids[$i]}" 2>/dev/null; done
    for i in "${!pids[@]}"; do { wait "${pids[$i]}"; } 2>/dev/null; done
    if [ -n "${SWARM_VERBOSE:-}" ]; then cat "$d"/log*; fi
    # shellcheck disable=SC2086
    if ! "$peer_bin" --check --n "$n" --compression "$comp" $check "$members"; then
        echo "$name: check failed; peer logs:"; cat "$d"/log*; rc=1
    fi
    [ $rc -eq 0 ] && echo "ok   $name ($m peers, $comp)" || echo "FAIL $name"
    return $rc
}

# swarm_mm_round NAME N COMPRESSION "CHECK FLAGS" MEMBER...: the same with
# the group formed by matchmaking on the DHT (every peer bootstraps from the
# first one's DHT node; the checker places each peer by the index its
# report gives). Members are role:weight:bandwidth (no faults).
swarm_mm_round() {
    local name=$1 n=$2 comp=$3 check=$4
    shift 4
    local d="$swarm_tmp/$name" m=$# i spec role weight bw pids=() boot=""
    mkdir -p "$d"
    head -c 32 /dev/urandom >"$d/secret" && chmod 600 "$d/secret"
    : >"$d/members"
    i=0
    for spec in "$@"; do
        IFS=: read -r role weight bw <<<"$spec"
        local extra=()
        [ "$role" = client ] && extra+=(--client)
        [ -n "$boot" ] && extra+=(--initial-peers "$boot")
        # shellcheck disable=SC2086 # the extra flags are words
        "$peer_bin" --key "$d/key$i" --secret "$d/secret" --matchmake --group-size "$m" \
            --mm-time 8 --round 1 --addr-out "$d/addr$i" --out "$d/out$i" --n "$n" \
            --seed $((1000 + i)) --weight "$weight" --bandwidth "$bw" --compression "$comp" \
            ${SWARM_PEER_FLAGS:-} "${extra[@]}" 2>"$d/log$i" &
        pids+=($!)
        swarm_pids+=($!)
        if [ -z "$boot" ]; then
            wait_for_files 30 "$d/addr0" || return 1
            boot="127.0.0.1:$(awk '{ print $3 }' "$d/addr0")"
        fi
        echo "? $((1000 + i)) $weight $d/out$i" >>"$d/members"
        i=$((i + 1))
    done
    local rc=0
    for i in "${!pids[@]}"; do
        if ! wait_bounded 60 "${pids[$i]}"; then
            echo "$name: peer $i failed:"; cat "$d/log$i"; rc=1
        fi
    done
    # shellcheck disable=SC2086
    if ! "$peer_bin" --check --n "$n" --compression "$comp" $check "$d/members"; then
        echo "$name: check failed; peer logs:"; cat "$d"/log*; rc=1
    fi
    [ $rc -eq 0 ] && echo "ok   $name ($m peers, $comp, matchmaking)" || echo "FAIL $name"
    return $rc
}
