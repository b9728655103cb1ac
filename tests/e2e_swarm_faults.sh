#!/usr/bin/env bash
# e2e_swarm_faults.sh: an all-reduce round among 4 peer processes on
# loopback (three full peers and a client) in which member 1 fails at
# each stage: it never starts, dies (SIGKILL) before sending, in the middle
# of its stream, while reducing, or stalls with its connections open. The
# others must finish well within the round deadline with the stated
# result, which swarm_peer --check verifies value by value: the exact
# weighted mean of the members each reducer's report lists (the failed one
# only in parts reduced before it failed), local values on a lost shard,
# and reports that name member 1 and give the exact averaged fraction.
set -u
cd "$(dirname "$0")/.." || exit 1
# the peer program beside the visc under test (run.sh sets VISC per build)
PEER_BIN=${PEER_BIN:-$(dirname "${VISC:-build/visc}")/tests/swarm_peer}
source tests/swarm_lib.sh

# short part deadlines (timing is the point here, but a loaded 2-core
# machine must still pass): a part may take 1.5 s plus 4 x its transfer
# time; the round has 30 s, and must end long before that
SWARM_PEER_FLAGS="--part-bytes 16384 --part-timeout 1.5 --connect-timeout 4 --round-timeout 30"
n=100000
rc=0
round() { swarm_round "$@" || rc=1; }
peers() { echo "full:1:1e7:none full:2:2e7:$1 full:3:1e7:none client:1.5:1e7:none"; }
done_in="--max-seconds 20"

# never sends a part: excluded from every part, its shard lost everywhere
for f in never-start die-before-send stall; do
    # shellcheck disable=SC2046
    round "$f" $n none "--expect-failed 1 --expect-excluded 1 --expect-lost 1 $done_in" $(peers "$f")
done
# dies as the first reduction begins: its shard is lost, its parts count
# only where they were reduced before it died (the reports say where)
# shellcheck disable=SC2046
round die-while-reducing $n none "--expect-failed 1 --expect-lost 1 $done_in" $(peers die-while-reducing)
# dies after a few parts: dropped from every part not yet reduced
# shellcheck disable=SC2046
round die-mid-stream $n none "--expect-failed 1 $done_in" $(peers die-mid-stream)
# the same with compression on
# shellcheck disable=SC2046
round die-before-send-q8 $n q8 "--expect-failed 1 --expect-excluded 1 --expect-lost 1 $done_in" $(peers die-before-send)
exit $rc
