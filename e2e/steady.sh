#!/usr/bin/env bash
# steady.sh: is the test command steady on a busy machine? It runs the
# command N times (default 3) with CPU-bound loops beside it the whole time
# (two, or $STEADY_LOAD), prints pass or fail for each run, and exits
# non-zero if any failed. The loops are stopped however the script ends.
#
#   e2e/steady.sh                      the README's test command (.ci/run), 3 times
#   e2e/steady.sh 5                    the same, 5 times
#   e2e/steady.sh 3 ./proxy/ ./timing/ go test -race -count=1 on those packages, 3 times
#
# Test results are never taken from Go's cache (-count=1), so each run runs
# every test again. A failed run's output is kept and its path printed.
set -uo pipefail
cd "$(dirname "$0")/.."

runs=${1:-3}
shift || true
load=${STEADY_LOAD:-2}
if ! [[ $runs =~ ^[0-9]+$ ]] || ((runs < 1)); then
	echo "usage: e2e/steady.sh [runs] [package ...]" >&2
	exit 2
fi

if (($#)); then
	what="go test -race -count=1 $*"
	run() { go test -race -count=1 "$@"; }
else
	what="the test command in .ci/run, with GOFLAGS=-count=1"
	run() { GOFLAGS="${GOFLAGS:+$GOFLAGS }-count=1" .ci/run; }
fi

loops=()
stop_loops() {
	for pid in "${loops[@]}"; do
		kill "$pid" 2>/dev/null
	done
	wait "${loops[@]}" 2>/dev/null
	loops=()
}
trap stop_loops EXIT
trap 'exit 130' INT TERM
for ((i = 0; i < load; i++)); do
	sh -c 'while :; do :; done' &
	loops+=("$!")
done

logs=$(mktemp -d "${TMPDIR:-/tmp}/steady.XXXXXX")
echo "steady: $runs runs of $what, beside $load CPU-bound loops (logs in $logs)"
failed=0
for ((i = 1; i <= runs; i++)); do
	log="$logs/run-$i.log"
	start=$SECONDS
	if run "$@" >"$log" 2>&1; then
		echo "run $i/$runs: pass ($((SECONDS - start))s)"
	else
		failed=$((failed + 1))
		echo "run $i/$runs: FAIL ($((SECONDS - start))s), output in $log"
		# The failing tests and their messages, or else (gofmt, vet,
		# staticcheck) the end of the output.
		if ! grep -E -- '^(--- FAIL|FAIL|panic:)|_test\.go:[0-9]+:' "$log" | head -20 | sed 's/^/    /' | grep .; then
			tail -n 10 "$log" | sed 's/^/    /'
		fi
	fi
done
echo "steady: $((runs - failed)) of $runs runs passed"
((failed == 0))
