#!/usr/bin/env bash
# make test-long: the full-length training runs, whose accuracies are the
# anchors' (../shared/reference/anchors.md) and the earlier issues' promises.
# make test runs the short forms of the first three (one epoch over
# --subset 2000 of the default recipe and of each transformer), because on
# a CI machine without AVX-512 these runs alone took longer than the rest
# of CI together.
# About 65 minutes on the 2-core AVX2 machine, 15 with AVX-512 and AMX.
# Closes with "N passed, N failed" as make test does.
set -u
passed=0 failed=0
# run NAME VAR=VALUE... SCRIPT: one run, its output whole, its verdict
run() {
    local name=$1 start rc=0; shift
    start=$(date +%s)
    env "$@" >"$log" 2>&1 || rc=$?
    cat "$log"
    if [ $rc -eq 0 ]; then echo "ok   $name"; passed=$((passed + 1));
    else echo "FAIL $name"; failed=$((failed + 1)); fi
    echo "# $name: $(($(date +%s) - start))s"
}
log=$(mktemp); trap 'rm -f "$log"' EXIT
run "fashion-mnist, 4 epochs (>= 90%)" EPOCHS=4 bash tests/e2e_train_fashion.sh
run "fashion-mnist, 12 epochs: the README's main job (>= 93%)" EPOCHS=12 bash tests/e2e_train_fashion.sh
run "vit 6 and swin 4 epochs (>= 85%)" LENGTH=long bash tests/e2e_train_transformers.sh
run "moco v2 learns (kNN over random weights)" bash tests/long/ssl_learns.sh
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
