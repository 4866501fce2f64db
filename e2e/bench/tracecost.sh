#!/usr/bin/env bash
# What tracing costs per request: two sidecars in front of the same
# emulated engine, one untraced and one sending every request's spans to a
# real OpenTelemetry Collector over OTLP/gRPC, loaded alternately; the
# sidecar process's own CPU (request path and exporter together) divided by
# the requests served.
#
#   e2e/bench/tracecost.sh    (installs wrk with apt-get if missing; builds
#                              the collector as the e2e tests do on first use)
#
# Settings (environment): UNARY_CLIENTS=32 UNARY_TOKENS=64 STREAMS=64
# TOKENS=64 ITL=20ms DURATION=10s ROUNDS=2.
set -euo pipefail
cd "$(dirname "$0")/../.."

UNARY_CLIENTS=${UNARY_CLIENTS:-32} UNARY_TOKENS=${UNARY_TOKENS:-64} STREAMS=${STREAMS:-64}
TOKENS=${TOKENS:-64} ITL=${ITL:-20ms} DURATION=${DURATION:-10s} ROUNDS=${ROUNDS:-2}

if ! command -v wrk >/dev/null; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq wrk >/dev/null
fi

work=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

bin=$work/timing-sidecar
.ci/build "$bin"
otelcol=$(go run ./e2e/prepare -path otelcol)

ENGINE=127.0.0.1:18100 PLAIN=127.0.0.1:18101 TRACED=127.0.0.1:18102
# The collector receives and encodes the spans and keeps none: what is
# measured is the sidecar's cost.
cat >"$work/otelcol.yaml" <<YAML
receivers:
  otlp: {protocols: {grpc: {endpoint: 127.0.0.1:18105}}}
exporters:
  file: {path: /dev/null}
service:
  pipelines: {traces: {receivers: [otlp], exporters: [file]}}
YAML
"$otelcol" --config "file:$work/otelcol.yaml" 2>"$work/otelcol.log" & pids+=($!)
"$bin" emulate --listen "$ENGINE" 2>"$work/engine.log" & pids+=($!)
common=(--upstream "http://$ENGINE" --access-log=false --readiness-interval 1h)
"$bin" "${common[@]}" --listen "$PLAIN" --admin-listen 127.0.0.1:18103 2>"$work/plain.log" & pids+=($!); plain_pid=$!
"$bin" "${common[@]}" --listen "$TRACED" --admin-listen 127.0.0.1:18104 --otlp-traces-endpoint http://127.0.0.1:18105 \
  2>"$work/traced.log" & pids+=($!); traced_pid=$!
sleep 2

clk=$(getconf CLK_TCK)
cpu() { awk -v c="$clk" '{printf "%.3f", ($14+$15)/c}' "/proc/$1/stat"; }
field() { grep -o "\"$2\":[-0-9.e+]*" <<<"$1" | cut -d: -f2; }
targets="untraced traced"
declare -A url=([untraced]="http://$PLAIN" [traced]="http://$TRACED") pid=([untraced]=$plain_pid [traced]=$traced_pid)
declare -A ucpu ureq scpu sreq
for t in $targets; do ucpu[$t]=0 ureq[$t]=0 scpu[$t]=0 sreq[$t]=0; done

cat >"$work/unary.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["X-Emulator-TTFT"] = "0s"
wrk.headers["X-Emulator-ITL"] = "0s"
wrk.body = '{"model":"emulated","messages":[{"role":"user","content":"bench"}],"max_tokens":$UNARY_TOKENS,"include_metrics":true}'
LUA
for r in $(seq "$ROUNDS"); do
  for t in $targets; do
    before=$(cpu "${pid[$t]}")
    out=$(wrk -t2 -c"$UNARY_CLIENTS" -d"$DURATION" -s "$work/unary.lua" "${url[$t]}/v1/chat/completions")
    after=$(cpu "${pid[$t]}")
    n=$(awk '/requests in/{print $1}' <<<"$out")
    ucpu[$t]=$(awk -v a="${ucpu[$t]}" -v b="$before" -v c="$after" 'BEGIN{print a+c-b}'); ureq[$t]=$((${ureq[$t]} + n))
    echo "  round $r unary $t: $(awk '/Requests\/sec/{print $2}' <<<"$out") requests/s" >&2

    before=$(cpu "${pid[$t]}")
    out=$("$bin" bench --json -c "$STREAMS" -d "$DURATION" --tokens "$TOKENS" --itl "$ITL" "${url[$t]}" 2>/dev/null)
    after=$(cpu "${pid[$t]}")
    scpu[$t]=$(awk -v a="${scpu[$t]}" -v b="$before" -v c="$after" 'BEGIN{print a+c-b}'); sreq[$t]=$((${sreq[$t]} + $(field "$out" requests)))
    echo "  round $r stream $t: $(field "$out" requests) streams, p50 $(field "$out" event_delay_p50_ms) ms" >&2
  done
done
dropped=$(curl -s 127.0.0.1:18104/metrics | awk '/^timing_sidecar_trace_spans_dropped_total/{s+=$2} END{print s+0}')
exported=$(curl -s 127.0.0.1:18104/metrics | awk '/^timing_sidecar_trace_spans_exported_total/{print $2}')

awk -v uc="${ucpu[untraced]}" -v un="${ureq[untraced]}" -v tc="${ucpu[traced]}" -v tn="${ureq[traced]}" \
    -v suc="${scpu[untraced]}" -v sun="${sreq[untraced]}" -v stc="${scpu[traced]}" -v stn="${sreq[traced]}" \
    -v dropped="$dropped" -v exported="$exported" -v dur="$DURATION" -v rounds="$ROUNDS" '
BEGIN {
  printf "\n%-22s %12s %12s %10s\n", "sidecar CPU per request", "untraced µs", "traced µs", "traced/untraced"
  printf "%-22s %12.1f %12.1f %10.2f\n", "unary (wrk)", uc/un*1e6, tc/tn*1e6, (tc/tn)/(uc/un)
  printf "%-22s %12.1f %12.1f %10.2f\n", "stream", suc/sun*1e6, stc/stn*1e6, (stc/stn)/(suc/sun)
  printf "unary requests served: untraced %d, traced %d (%.2f)\n", un, tn, tn/un
  printf "spans exported %d, dropped %d\n", exported, dropped
}'
