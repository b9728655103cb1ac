#!/usr/bin/env bash
# e2e_swarm_dht.sh: four DHT node processes (tests/swarm_dht_node.c) in four
# network namespaces, two on each side of one link. They see each other's
# records; with the link down (a partition) each side still publishes and
# reads its own side's records and does not see the other side's new ones;
# with the link up again (healed) all see all new records within a bound.
#
# Topology (all in 10.77.0.0/24): namespaces a1 a2 hang off bridge brA, b1 b2
# off bridge brB, both bridges in a switch namespace joined by one veth pair
# (the link). Needs root (ip netns). Every wait is bounded; everything is
# removed by the trap, also on failure.
set -euo pipefail
VISC=${VISC:-build/visc}
NODE=$(dirname "$VISC")/tests/swarm_dht_node
[ -x "$NODE" ] || { echo "e2e_swarm_dht: $NODE not built"; exit 1; }

tag=vd$$ # unique per run: names of namespaces and links
sw=${tag}sw
names=(a1 a2 b1 b2)
declare -A ip=([a1]=10.77.0.1 [a2]=10.77.0.2 [b1]=10.77.0.3 [b2]=10.77.0.4)
work=$(mktemp -d)
pids=()

cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    for n in "${names[@]}"; do ip netns del "$tag$n" 2>/dev/null || true; done
    ip netns del "$sw" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# (to stderr: it may run inside a command substitution, whose exit set -e sees)
fail() {
    {
        echo "e2e_swarm_dht: FAIL: $*"
        for n in "${names[@]}"; do echo "--- $n"; cat "$work/$n.out" "$work/$n.err" 2>/dev/null; done
    } >&2
    exit 1
}

# ---- network ----
ip netns add "$sw"
ip -n "$sw" link set lo up
for side in A B; do
    ip -n "$sw" link add "br$side" type bridge
    ip -n "$sw" link set "br$side" up
done
ip -n "$sw" link add linkA type veth peer name linkB
ip -n "$sw" link set linkA master brA
ip -n "$sw" link set linkB master brB
ip -n "$sw" link set linkA up
ip -n "$sw" link set linkB up
for n in "${names[@]}"; do
    ns=$tag$n
    side=$([ "${n:0:1}" = a ] && echo A || echo B)
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip link add "$tag$n" netns "$ns" type veth peer name "p$n" netns "$sw"
    ip -n "$ns" link set "$tag$n" name eth0
    ip -n "$ns" addr add "${ip[$n]}/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$sw" link set "p$n" master "br$side"
    ip -n "$sw" link set "p$n" up
done

# ---- nodes: every node bootstraps from the two well-known peers a1 and b1
# (one on each side; a node started before its peer finds it when it pings
# again), as a real swarm lists a few stable peers in --initial-peers ----
port=4222
for n in "${names[@]}"; do
    mkfifo "$work/$n.in"
    peers=""
    for p in a1 b1; do [ "$p" = "$n" ] || peers=${peers:+$peers,}${ip[$p]}:$port; done
    ip netns exec "$tag$n" "$NODE" --run e2e-dht --secret "e2e swarm dht secret" \
        --port "$port" --rebootstrap 1 --peers "$peers" \
        <"$work/$n.in" >"$work/$n.out" 2>"$work/$n.err" &
    pids+=($!)
    eval "exec {fd_$n}>\"$work/$n.in\""
done

seq=0
# send NODE COMMAND...: queues a command; its id is left in $last_id.
send() {
    local n=$1 fdvar=fd_$1
    shift
    seq=$((seq + 1))
    last_id=$seq
    echo "$seq $*" >&"${!fdvar}"
}
# answer NODE ID TIMEOUT_S: prints the answer line (without the id) or fails.
answer() {
    local n=$1 id=$2 end=$((SECONDS + $3)) line
    while [ $SECONDS -le $end ]; do
        line=$(grep -m1 "^$id " "$work/$n.out" || true)
        [ -n "$line" ] && { echo "${line#"$id "}"; return 0; }
        sleep 0.05
    done
    fail "$n: no answer to command $id within $3 s"
}
# on_all TIMEOUT COMMAND...: runs the command on every node at once and
# checks that every answer starts with "ok". "NODE" in it becomes the node.
on_all() {
    local t=$1 n
    shift
    declare -A ids
    for n in "${names[@]}"; do send "$n" "${@//NODE/$n}"; ids[$n]=$last_id; done
    for n in "${names[@]}"; do
        a=$(answer "$n" "${ids[$n]}" "$t")
        case "$a" in ok*) ;; *) fail "$n: '$*' answered '$a'";; esac
    done
}

for n in "${names[@]}"; do
    end=$((SECONDS + 10))
    until grep -q '^ready' "$work/$n.out"; do
        [ $SECONDS -le $end ] || fail "$n did not start"
        sleep 0.05
    done
done

start=$SECONDS
# 1. connected: everyone sees everyone's record
on_all 30 put k NODE.1 60
on_all 30 see k 15 a1.1 a2.1 b1.1 b2.1
echo "# connected: all four see all records ($((SECONDS - start)) s)"

# 2. partition: the link goes down
ip -n "$sw" link set linkA down
t=$SECONDS
on_all 40 put k NODE.2 60
echo "# partition: puts on both sides done ($((SECONDS - t)) s)"
for n in a1 a2; do
    send "$n" see k 15 a1.2 a2.2; a=$(answer "$n" "$last_id" 20)
    [ "${a%% *}" = ok ] || fail "$n does not see its side's new records: $a"
    send "$n" get k; a=$(answer "$n" "$last_id" 20)
    case " $a " in *" b1.2 "*|*" b2.2 "*) fail "$n sees the other side across a partition: $a";; esac
done
for n in b1 b2; do
    send "$n" see k 15 b1.2 b2.2; a=$(answer "$n" "$last_id" 20)
    [ "${a%% *}" = ok ] || fail "$n does not see its side's new records: $a"
    send "$n" get k; a=$(answer "$n" "$last_id" 20)
    case " $a " in *" a1.2 "*|*" a2.2 "*) fail "$n sees the other side across a partition: $a";; esac
done
echo "# partition: each side sees its own side only ($((SECONDS - t)) s)"

# Hold the partition long enough that each side's OpenDHT nodes drop the
# other side as dead (measured: after a partition of ~7 s the nodes still
# remember each other and heal by themselves; after 12 s, without visc_dht's
# re-bootstrapping, the halves stayed apart for 20 s and more). Healing from
# there is what the re-bootstrap must achieve.
while [ $((SECONDS - t)) -lt 12 ]; do sleep 0.2; done

# 3. healed: the link comes back; new records reach everyone within the bound
ip -n "$sw" link set linkA up
t=$SECONDS
on_all 40 put k NODE.3 60
on_all 30 see k 20 a1.3 a2.3 b1.3 b2.3
echo "# healed: all four see all new records ($((SECONDS - t)) s)"

on_all 10 quit
for p in "${pids[@]}"; do wait "$p" || fail "a node exited with an error"; done
pids=()
echo "# e2e_swarm_dht: $((SECONDS - start)) s"
