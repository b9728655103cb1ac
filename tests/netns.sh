# netns.sh: small network topologies for swarm tests and benchmarks
# (sourced by bash scripts, not run; needs root, iproute2 and tc).
#
# N peers, each in its own network namespace with lo up and one veth
# ("eth0") into a bridge that lives in an extra namespace, so the host's
# network is never touched and names never clash between parallel runs
# (every name carries the script's pid).
#
#   netns_setup N [RATE]   creates peers 0..N-1; with RATE (an integer and
#                          kbit/mbit/gbit: "100mbit", "1gbit") each link is
#                          shaped with tbf in BOTH directions (egress of the
#                          peer's eth0 and egress of the bridge-side veth)
#   netns_exec I CMD...    runs CMD in peer I's namespace
#   netns_name I           prints peer I's namespace name (for ip netns ...)
#   netns_addr I           prints peer I's IPv4 address (10.A.B.(I+1), /24)
#   netns_link_down I      cuts peer I off the bridge (a partition)
#   netns_link_up I        reconnects it
#   netns_wait_tcp I ADDR PORT SECS
#                          waits (at most SECS) until a TCP connect from
#                          peer I to ADDR:PORT succeeds; 0, or 1 on timeout
#   netns_cleanup          kills what still runs in the namespaces and
#                          deletes them; idempotent, safe before setup
#   $NETNS_N               the number of peers set up
#
# Typical use:
#   . tests/netns.sh
#   trap netns_cleanup EXIT
#   netns_setup 4 100mbit || exit 1
#   netns_exec 0 build/visc_swarm_peer --listen "$(netns_addr 0):7000" &
#
# The subnet 10.A.B.0/24 is derived from the pid only to keep addresses
# readable in logs; the namespaces are private, so clashes are harmless.

NETNS_PREFIX="vsw$$-"
NETNS_BRIDGE="${NETNS_PREFIX}br"
# shellcheck disable=SC2034 # read by the scripts that source this file
NETNS_N=0
NETNS_SUBNET="10.$((100 + $$ % 100)).$(($$ / 100 % 256))"

netns_name() { echo "${NETNS_PREFIX}$1"; }
netns_addr() { echo "${NETNS_SUBNET}.$(($1 + 1))"; }
netns_exec() {
    local i=$1
    shift
    ip netns exec "${NETNS_PREFIX}$i" "$@"
}

# _netns_burst RATE: tbf bucket of 10 ms at RATE, at least 16 KiB (below
# that one MTU-sized GSO batch would not fit and throughput collapses).
_netns_burst() {
    local r=$1 num unit bits
    num=${r%%[a-zA-Z]*}
    unit=${r#"$num"}
    case "$unit" in
        kbit) bits=$((num * 1000)) ;;
        mbit) bits=$((num * 1000000)) ;;
        gbit) bits=$((num * 1000000000)) ;;
        bit | "") bits=$num ;;
        *)
            echo "netns: rate '$r' not understood (use kbit, mbit or gbit)" >&2
            return 1
            ;;
    esac
    local bytes=$((bits / 8 / 100))
    if [ "$bytes" -lt 16384 ]; then bytes=16384; fi
    echo "$bytes"
}

_netns_shape() { # NS DEV RATE BURST
    ip -n "$1" link set "$2" txqueuelen 1000
    tc -n "$1" qdisc replace dev "$2" root tbf rate "$3" burst "$4" latency 200ms
}

# Whether peer I's eth0 is up with carrier (no pipe: safe under pipefail).
_netns_carrier() {
    local line
    line=$(ip -n "${NETNS_PREFIX}$1" -o link show eth0 2>/dev/null) || return 1
    [[ $line == *"state UP"* ]]
}

netns_setup() {
    local n=$1 rate=${2:-} burst="" i ns
    if [ -n "$rate" ]; then
        burst=$(_netns_burst "$rate") || return 1
    fi
    ip netns add "$NETNS_BRIDGE" || return 1
    ip -n "$NETNS_BRIDGE" link set lo up
    ip -n "$NETNS_BRIDGE" link add br0 type bridge || return 1
    ip -n "$NETNS_BRIDGE" link set br0 up
    for ((i = 0; i < n; i++)); do
        ns="${NETNS_PREFIX}$i"
        ip netns add "$ns" || return 1
        NETNS_N=$((i + 1))
        ip -n "$ns" link set lo up
        # Created inside the bridge namespace, the peer end moved straight
        # into the peer's namespace: no name ever exists on the host.
        ip -n "$NETNS_BRIDGE" link add "p$i" type veth peer name eth0 netns "$ns" || return 1
        ip -n "$NETNS_BRIDGE" link set "p$i" master br0
        ip -n "$NETNS_BRIDGE" link set "p$i" up
        ip -n "$ns" addr add "$(netns_addr "$i")/24" dev eth0
        ip -n "$ns" link set eth0 up
        if [ -n "$rate" ]; then
            _netns_shape "$ns" eth0 "$rate" "$burst" || return 1
            _netns_shape "$NETNS_BRIDGE" "p$i" "$rate" "$burst" || return 1
        fi
    done
    # Wait (bounded) until every link reports carrier, so the first packet
    # of a test is not lost to a link still coming up.
    local tries
    for ((i = 0; i < n; i++)); do
        for ((tries = 0; tries < 50; tries++)); do
            _netns_carrier "$i" && break
            sleep 0.1
        done
    done
    return 0
}

netns_link_down() { ip -n "$NETNS_BRIDGE" link set "p$1" down; }
netns_link_up() {
    ip -n "$NETNS_BRIDGE" link set "p$1" up
    local tries
    for ((tries = 0; tries < 50; tries++)); do
        _netns_carrier "$1" && return 0
        sleep 0.1
    done
    return 0
}

netns_wait_tcp() {
    local i=$1 addr=$2 port=$3 secs=$4 t
    for ((t = 0; t < secs * 10; t++)); do
        netns_exec "$i" timeout 1 bash -c "exec 3<>/dev/tcp/$addr/$port" 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

netns_cleanup() {
    local ns pids
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
        case "$ns" in "$NETNS_PREFIX"*) ;; *) continue ;; esac
        # Processes this script started inside; a namespace with live
        # processes would keep its veth (and the test's ports) alive.
        pids=$(ip netns pids "$ns" 2>/dev/null)
        if [ -n "$pids" ]; then
            # shellcheck disable=SC2086
            kill $pids 2>/dev/null || true
            sleep 0.2
            pids=$(ip netns pids "$ns" 2>/dev/null)
            # shellcheck disable=SC2086
            if [ -n "$pids" ]; then kill -9 $pids 2>/dev/null || true; fi
        fi
        ip netns del "$ns" 2>/dev/null || true
    done
    # shellcheck disable=SC2034
    NETNS_N=0
    return 0
}
