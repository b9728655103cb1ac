#!/usr/bin/env bash
# e2e_swarm_hostile.sh: an all-reduce round among 4 full peers on loopback,
# one of them hostile: it sends NaN, Inf, huge values or a part of the
# wrong size; writes an oversized length prefix or replays a frame onto its
# channels; signs with a key nobody allowed; or lacks the swarm secret.
# Each attack must be rejected: the honest peers ban or drop the hostile
# member, report it, and their result is exactly the weighted mean of the
# honest peers (the hostile member's values in no part, and its shard
# left at each peer's own values: nothing it reduced is used).
set -u
cd "$(dirname "$0")/.." || exit 1
# the peer program beside the visc under test (run.sh sets VISC per build)
PEER_BIN=${PEER_BIN:-$(dirname "${VISC:-build/visc}")/tests/swarm_peer}
source tests/swarm_lib.sh

SWARM_PEER_FLAGS="--part-bytes 16384 --part-timeout 1.5 --connect-timeout 4 --round-timeout 30"
n=100000
rc=0
expect="--expect-excluded H --expect-lost H --max-seconds 20"
round() { swarm_round "$@" || rc=1; }

# bad data (member 2, which accepts its channel from 0 and 1 and opens the
# one to 3): banned for invalid data
for f in nan inf huge wrong-size; do
    round "$f" $n none "--expect-banned 2 ${expect//H/2}" \
        full:1:1e7:none full:2:1e7:none full:3:1e7:"$f" full:1.5:1e7:none
done
# raw bytes on the channel, and peers the handshake refuses (member 0,
# which opens every channel itself)
for f in oversized-length replay unknown-key no-secret; do
    round "$f" $n none "--expect-failed 0 ${expect//H/0}" \
        full:3:1e7:"$f" full:1:1e7:none full:2:1e7:none full:1.5:1e7:none
done
exit $rc
