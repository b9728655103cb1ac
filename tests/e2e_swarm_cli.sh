#!/usr/bin/env bash
# `visc swarm keygen|pubkey|token|node`: keys are created 0600 and never
# overwritten, tokens admit the named peer, a standing node starts and
# stops cleanly, and bad input gets one line and exit status 1.
set -uo pipefail
V=${VISC:-build/visc}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
expect_error() { # expect_error PATTERN ARGS...
    local pattern=$1; shift
    local err rc
    err=$(timeout -k 10 60 "$V" "$@" 2>&1 >/dev/null); rc=$?
    if [ $rc -ne 1 ] || ! grep -q -- "$pattern" <<<"$err" || [ "$(wc -l <<<"$err")" -ne 1 ]; then
        fail "visc $* -> exit $rc, stderr: $err (wanted one line matching '$pattern')"
    else
        echo "ok: visc $* -> $err"
    fi
}

out=$("$V" swarm keygen "$tmp/owner.key" --public "$tmp/owner.pub") || fail "keygen owner"
echo "$out"
"$V" swarm keygen "$tmp/peer.key" --public "$tmp/peer.pub" >/dev/null || fail "keygen peer"
[ "$(stat -c %a "$tmp/owner.key")" = 600 ] || fail "key file mode is $(stat -c %a "$tmp/owner.key")"
pub=$(cut -c1-64 "$tmp/owner.pub")
grep -q "public key $pub" <<<"$out" || fail "keygen printed another public key than it wrote"
[ "$("$V" swarm pubkey "$tmp/owner.key" | cut -d' ' -f1)" = "$pub" ] || fail "pubkey disagrees"

# An existing key is never overwritten, a key readable by others is refused.
before=$(md5sum <"$tmp/owner.key")
expect_error "exists; not overwriting" swarm keygen "$tmp/owner.key"
[ "$(md5sum <"$tmp/owner.key")" = "$before" ] || fail "keygen changed an existing key"
cp "$tmp/peer.key" "$tmp/open.key"; chmod 644 "$tmp/open.key"
expect_error "readable by group or others" swarm pubkey "$tmp/open.key"
expect_error "open.key" swarm node --run-id r --key "$tmp/open.key" --swarm-secret-file "$tmp/owner.key"

# Tokens: hex of VISC_TOKEN_BYTES, written atomically.
"$V" swarm token --owner-key "$tmp/owner.key" --peer-file "$tmp/peer.pub" --run-id run1 \
    --valid-days 2 -o "$tmp/peer.tok" >/dev/null || fail "token"
[ "$(tr -d '\n' <"$tmp/peer.tok" | wc -c)" -eq 280 ] || fail "token is not 140 bytes of hex"
expect_error "expected 64 hex digits" swarm token --owner-key "$tmp/owner.key" \
    --peer-file "$tmp/peer.tok" --run-id run1 -o "$tmp/x.tok"
expect_error "needs --owner-key" swarm token --peer-file "$tmp/peer.pub" -o "$tmp/x.tok"
expect_error "valid-days: expected a number > 0" swarm token --owner-key "$tmp/owner.key" \
    --peer-file "$tmp/peer.pub" --run-id run1 --valid-days -3 -o "$tmp/x.tok"
[ -e "$tmp/x.tok" ] && fail "a refused token command left a file"

# A node needs credentials; with them it starts, prints its address and stops.
expect_error "credentials\|secret" swarm node --run-id run1 --key "$tmp/peer.key"
expect_error "unknown option '--bogus'" swarm node --bogus 1
expect_error "unknown command 'frob'" swarm frob
head -c 32 /dev/urandom >"$tmp/secret"; chmod 600 "$tmp/secret"
out=$(timeout 60 "$V" swarm node --run-id run1 --key "$tmp/peer.key" --swarm-secret-file "$tmp/secret" \
    --listen 127.0.0.1:0 --seconds 1) || fail "node exited with $?"
echo "$out"
grep -q "at 127.0.0.1:[0-9]*, DHT port [0-9]*" <<<"$out" || fail "node did not print its addresses"
# ... and the token admits the peer into a swarm that has only an owner key.
out=$(timeout 60 "$V" swarm node --run-id run1 --key "$tmp/peer.key" --owner-key-pub "$pub" \
    --token "$tmp/peer.tok" --listen 127.0.0.1:0 --seconds 1) || fail "node with a token exited with $?"

# Flags: every credential kind, their errors, the default key under $HOME.
node=(swarm node --run-id run1 --listen 127.0.0.1:0 --seconds 1)
mkdir "$tmp/home"
out=$(HOME="$tmp/home" timeout 60 "$V" "${node[@]}" --swarm-secret-file "$tmp/secret" --no-encrypt \
    --dht-port 0) || fail "node with the default key exited with $?"
[ "$(stat -c %a "$tmp/home/.visc")" = 700 ] && [ "$(stat -c %a "$tmp/home/.visc/swarm.key")" = 600 ] ||
    fail "the default key folder or file has the wrong mode"
out=$(timeout 60 "$V" "${node[@]}" --key "$tmp/peer.key" --allow-file "$tmp/owner.pub") ||
    fail "node with an allowlist exited with $?"
expect_error "expected a port 0..65535, got '70000'" "${node[@]}" --dht-port 70000
expect_error "option '--dht-port' needs a value" swarm node --dht-port
expect_error "owner-key-pub" "${node[@]}" --key "$tmp/peer.key" --owner-key-pub nothex
expect_error "not a hex string" "${node[@]}" --key "$tmp/peer.key" --owner-key-pub "$pub" \
    --token <(printf 'zz%.0s' $(seq 140))
expect_error "No such file" "${node[@]}" --key "$tmp/peer.key" --owner-key-pub "$pub" --token "$tmp/none"
expect_error "expected a number > 0" "${node[@]}" --key "$tmp/peer.key" --seconds soon
expect_error "needs --run-id" swarm node --key "$tmp/peer.key" --swarm-secret-file "$tmp/secret"
expect_error "unexpected argument" swarm keygen "$tmp/a.key" "$tmp/b.key"
expect_error "unknown option '--bogus'" swarm token --bogus 1
expect_error "expected one key file" swarm pubkey
"$V" swarm >/dev/null 2>&1; [ $? -eq 2 ] || fail "visc swarm without a command should exit 2"
grep -q "swarm options" <<<"$("$V" swarm --help)" || fail "visc swarm --help lists no options"

# A standing node stops cleanly on SIGTERM; `swarm status` joins through it
# and lists nobody (no training peer publishes progress); the monitor
# writes a TensorBoard file.
"$V" swarm node --run-id run2 --key "$tmp/peer.key" --swarm-secret-file "$tmp/secret" \
    --listen 127.0.0.1:0 >"$tmp/node.out" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q "DHT port" "$tmp/node.out" && break; sleep 0.1; done
port=$(sed -n 's/.*DHT port \([0-9]*\);.*/\1/p' "$tmp/node.out")
[ -n "$port" ] || fail "the node printed no DHT port"
observer=(--run-id run2 --key "$tmp/owner.key" --swarm-secret-file "$tmp/secret" --initial-peers "127.0.0.1:$port")
out=$(timeout 60 "$V" swarm status "${observer[@]}" --target-batch-size 64 2>&1) || fail "status exited with $?: $out"
echo "$out"
timeout 60 "$V" swarm monitor "${observer[@]}" --logdir "$tmp/mon" --interval 0.5 --seconds 1.5 >/dev/null 2>&1 ||
    fail "monitor exited with $?"
ls "$tmp/mon"/events.out.tfevents.* >/dev/null 2>&1 || fail "the monitor wrote no event file"
kill -TERM $pid; wait $pid || fail "the node did not exit cleanly on SIGTERM (status $?)"

# `visc train --swarm`: its flags, checked before anything starts.
sw=(train --epochs 1 --output "$tmp/sw" --swarm --run-id r --key "$tmp/peer.key" --swarm-secret-file "$tmp/secret")
expect_error "swarm options need --swarm" train --target-batch-size 64
expect_error "needs --target-batch-size" "${sw[@]}"
expect_error "averaging: expected gradients or parameters" "${sw[@]}" --averaging sideways
expect_error "swarm-shard: expected I/N" "${sw[@]}" --swarm-shard 3/2
expect_error "group-size: expected 2..64" "${sw[@]}" --group-size 1
expect_error "on-failure: expected skip or local" "${sw[@]}" --on-failure panic
expect_error "matchmaking-time: expected a number" "${sw[@]}" --matchmaking-time -1
expect_error "swarm-linger: expected a number" "${sw[@]}" --swarm-linger forever
expect_error "option '--target-batch-size' needs a value" "${sw[@]}" --target-batch-size
expect_error "zip" "${sw[@]}" --target-batch-size 64 --compression zip
expect_error "median" "${sw[@]}" --target-batch-size 64 --aggregation median
expect_error "neither a swarm secret" train --swarm --run-id r --key "$tmp/peer.key" --target-batch-size 64
grep -q -- "--target-batch-size" <<<"$("$V" train --help)" || fail "train --help lists no swarm options"

[ $fails -eq 0 ] && echo "swarm CLI: all checks passed"
exit $((fails > 0))
