#!/usr/bin/env bash
# shellcheck disable=SC2034 # the peer lists are read through ${!size}
# e2e_swarm_allreduce.sh: all-reduce rounds among 2, 3, 5 and 8 peer
# processes on loopback, full peers and clients mixed, unequal weights and
# bandwidths (so unequal shards), with each compression. Every peer must
# end with the exact weighted mean of all inputs (to fp32 rounding without
# compression; within two roundings of the encoding with it), every peer
# holding bit for bit what the shard's reducer holds, and a report of a
# complete round. One more round forms its group by matchmaking.
set -u
cd "$(dirname "$0")/.." || exit 1
# the peer program beside the visc under test (run.sh sets VISC per build)
PEER_BIN=${PEER_BIN:-$(dirname "${VISC:-build/visc}")/tests/swarm_peer}
source tests/swarm_lib.sh

# 16 KiB parts: several parts per shard, and the last part of a shard short
SWARM_PEER_FLAGS="--part-bytes 16384 --round-timeout 60"
n=100003
rc=0
two="full:1:1e7:none client:2.5:1e7:none"
three="full:1:1e7:none client:2.5:2e7:none full:3:3e7:none"
five="full:1:1e7:none client:2.5:2e7:none full:3:3e7:none full:0.5:1e7:none client:7:1e7:none"
eight="$five full:1:5e7:none full:2:1e7:none full:4:1e7:none"
for comp in none fp16 bf16 q8; do
    for size in two three five eight; do
        # shellcheck disable=SC2086
        swarm_round "$size-$comp" $n "$comp" --expect-complete ${!size} || rc=1
    done
done
# all full peers, equal weights
# shellcheck disable=SC2086
swarm_round four-full $n none --expect-complete full:1:1e7:none full:1:1e7:none full:1:1e7:none \
    full:1:1e7:none || rc=1
# q8 with error feedback (its first round sends what plain q8 sends)
# shellcheck disable=SC2086
SWARM_PEER_FLAGS="--part-bytes 16384 --round-timeout 60 --error-feedback" \
    swarm_round five-q8-feedback $n q8 --expect-complete $five || rc=1
# the whole stack: DHT discovery, matchmaking into one group, all-reduce
swarm_mm_round matchmade $n none --expect-complete full:1:1e7 full:2:2e7 client:3:1e7 \
    full:0.5:1e7 || rc=1
exit $rc
