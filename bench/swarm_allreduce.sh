#!/usr/bin/env bash
# swarm_allreduce.sh: goodput of the butterfly all-reduce (swarm_peer
# processes) among 4 and 8 peers, each in its own network namespace with
# its link shaped to RATE in both directions (tests/netns.sh, tc tbf).
# The butterfly bound: every peer sends and receives 2 (N-1)/N of the
# vector, so a round takes at least 2 (N-1)/N x size / bandwidth; printed
# is the bound over the measured round time (the slowest peer's), for each
# compression, and the speed-up of each compression over none.
#
#   bench/swarm_allreduce.sh [MB] [RATE_MBIT] [PEER COUNTS] [COMPRESSIONS]
#   defaults: 100 MB, 100 Mbit/s, "4 8", "none fp16 q8"
# Needs root (namespaces) and a build (make tests). Not part of the suite.
set -u
cd "$(dirname "$0")/.." || exit 1
mb=${1:-100}
mbit=${2:-100}
counts=${3:-4 8}
comps=${4:-none fp16 q8}
peer=${PEER_BIN:-build/tests/swarm_peer}
[ -x "$peer" ] || { echo "build $peer first (make tests)"; exit 1; }
. tests/netns.sh
tmp=$(mktemp -d /tmp/visc_swarm_bench.XXXXXX)
trap 'netns_cleanup; rm -rf "$tmp"' EXIT
n=$((mb * 1000000 / 4))
bw=$((mbit * 1000000 / 8)) # bytes/s
echo "# all-reduce of $mb MB, links $mbit Mbit/s per peer (both directions), tbf"
printf '%-6s %-6s %9s %9s %9s %9s\n' peers comp seconds bound fraction speedup
for N in $counts; do
    netns_cleanup
    netns_setup "$N" "${mbit}mbit" || { echo "namespace setup failed"; exit 1; }
    base=""
    for comp in $comps; do
        d="$tmp/$N-$comp"
        mkdir -p "$d"
        head -c 32 /dev/urandom >"$d/secret" && chmod 600 "$d/secret"
        pids=()
        for ((i = 0; i < N; i++)); do
            netns_exec "$i" "$peer" --key "$d/key$i" --secret "$d/secret" \
                --listen "$(netns_addr "$i"):0" --addr-out "$d/addr$i" --group "$d/group" \
                --out "$d/out$i" --n "$n" --seed $((7 + i)) --bandwidth "$bw" \
                --compression "$comp" --round-timeout 600 --wait 120 ${BENCH_PEER_FLAGS:-} 2>"$d/log$i" &
            pids+=($!)
        done
        for ((i = 0; i < N; i++)); do
            t=0
            while [ ! -f "$d/addr$i" ] && [ $t -lt 1200 ]; do sleep 0.05; t=$((t + 1)); done
        done
        {
            head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n'
            echo
            for ((i = 0; i < N; i++)); do
                read -r pk addr _ <"$d/addr$i"
                echo "$pk $addr $bw 0"
            done
        } >"$d/group.tmp" && mv "$d/group.tmp" "$d/group"
        ok=1
        for p in "${pids[@]}"; do wait "$p" || ok=0; done
        secs=0
        for ((i = 0; i < N; i++)); do
            line=$(head -c 400 "$d/out$i" 2>/dev/null | head -1)
            [[ $line == *'"status":0,'* ]] || ok=0
            s=$(echo "$line" | sed -n 's/.*"seconds":\([0-9.]*\).*/\1/p')
            secs=$(awk -v a="$secs" -v b="${s:-0}" 'BEGIN { print (b > a ? b : a) }')
        done
        rm -f "$d"/out*
        if [ $ok -ne 1 ]; then
            echo "$N peers, $comp: a round failed:"; cat "$d"/log*; exit 1
        fi
        bound=$(awk -v n="$N" -v s="$((mb * 1000000))" -v b="$bw" \
            'BEGIN { printf "%.2f", 2 * (n - 1) / n * s / b }')
        [ -z "$base" ] && base=$secs
        awk -v N="$N" -v c="$comp" -v t="$secs" -v b="$bound" -v z="$base" \
            'BEGIN { printf "%-6d %-6s %9.2f %9.2f %9.3f %9.2f\n", N, c, t, b, b / t, z / t }'
    done
done
