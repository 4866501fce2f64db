#!/usr/bin/env bash
# Compares timing-sidecar (metrics on) with nginx (proxy_buffering off, which
# does no timing and no JSON work) and a direct connection, all in front of
# the same emulated engine on this machine, and prints the ratios the
# performance targets are stated in. A fourth target, go-relay
# (e2e/bench/tcprelay: a Go TCP relay that parses nothing), shows what any
# Go proxy pays here, so the sidecar's own cost can be told from the
# runtime's.
#
#   e2e/bench/compare.sh            (installs nginx and wrk with apt-get if missing)
#
# Settings (environment): STREAMS=200 ITL=20ms TOKENS=100 DURATION=10s ROUNDS=2
# UNARY_CLIENTS=32 UNARY_TOKENS=64 HOLD=5000 (open streams for the memory test).
# Loads alternate direct, sidecar, nginx, go-relay, direct, ... to cancel
# machine drift.
set -euo pipefail
cd "$(dirname "$0")/../.."

STREAMS=${STREAMS:-200} ITL=${ITL:-20ms} TOKENS=${TOKENS:-100} DURATION=${DURATION:-10s}
ROUNDS=${ROUNDS:-2} UNARY_CLIENTS=${UNARY_CLIENTS:-32} UNARY_TOKENS=${UNARY_TOKENS:-64} HOLD=${HOLD:-5000}

if ! command -v nginx >/dev/null || ! command -v wrk >/dev/null; then
  echo "installing nginx and wrk..." >&2
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nginx-light wrk >/dev/null
fi
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

work=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

bin=$work/timing-sidecar
.ci/build "$bin"
CGO_ENABLED=0 go build -o "$work/tcprelay" ./e2e/bench/tcprelay
ENGINE=127.0.0.1:18000 SIDECAR=127.0.0.1:18001 ADMIN=127.0.0.1:18002 NGINX=127.0.0.1:18003 RELAY=127.0.0.1:18004

"$bin" emulate --listen "$ENGINE" 2>"$work/engine.log" & pids+=($!); engine_pid=$!
"$bin" --listen "$SIDECAR" --admin-listen "$ADMIN" --upstream "http://$ENGINE" --access-log=false \
  --readiness-interval 1h 2>"$work/sidecar.log" & pids+=($!); sidecar_pid=$!
cat >"$work/nginx.conf" <<NGINX
$( [ "$(id -u)" = 0 ] && echo "user root;" )
worker_processes auto;
worker_rlimit_nofile 65536;
pid $work/nginx.pid;
error_log $work/nginx-error.log warn;
daemon off;
events { worker_connections 16384; }
http {
  access_log off;
  client_body_temp_path $work; proxy_temp_path $work;
  upstream engine { server $ENGINE; keepalive 1024; }
  server {
    listen $NGINX;
    location / {
      proxy_pass http://engine;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_read_timeout 1h;
    }
  }
}
NGINX
nginx -c "$work/nginx.conf" -p "$work" & pids+=($!); nginx_pid=$!
"$work/tcprelay" --listen "$RELAY" --upstream "$ENGINE" & pids+=($!); relay_pid=$!
sleep 1

clk=$(getconf CLK_TCK)
# procs PID: the process and its children (nginx's workers).
procs() { echo "$1" $(pgrep -P "$1" || true); }
# cpu PID: user+system CPU seconds of the process tree.
cpu() { local t=0 v; for p in $(procs "$1"); do v=$(awk '{print $14+$15}' "/proc/$p/stat" 2>/dev/null) && t=$((t + v)); done; awk -v t="$t" -v c="$clk" 'BEGIN{printf "%.3f", t/c}'; }
# rss PID: resident MB of the process tree.
rss() { local k=0 v; for p in $(procs "$1"); do v=$(awk '/VmRSS/{print $2}' "/proc/$p/status" 2>/dev/null) && [ -n "$v" ] && k=$((k + v)); done; awk -v k="$k" 'BEGIN{printf "%.1f", k/1024}'; }
field() { grep -o "\"$2\":[-0-9.e+]*" <<<"$1" | cut -d: -f2; }

targets="direct sidecar nginx go-relay"
declare -A url=([direct]="http://$ENGINE" [sidecar]="http://$SIDECAR" [nginx]="http://$NGINX" [go-relay]="http://$RELAY")
declare -A pid=([direct]=$engine_pid [sidecar]=$sidecar_pid [nginx]=$nginx_pid [go-relay]=$relay_pid)
declare -A p50 p99 events cpus rps maxrss
for t in $targets; do p50[$t]=0 p99[$t]=0 events[$t]=0 cpus[$t]=0 rps[$t]=0 maxrss[$t]=0; done

echo "streaming: $STREAMS streams, $TOKENS tokens at $ITL, $DURATION per run, $ROUNDS rounds" >&2
for r in $(seq "$ROUNDS"); do
  for t in $targets; do
    before=$(cpu "${pid[$t]}")
    out=$("$bin" bench --json -c "$STREAMS" -d "$DURATION" --tokens "$TOKENS" --itl "$ITL" "${url[$t]}" 2>/dev/null)
    after=$(cpu "${pid[$t]}")
    [ "$(field "$out" errors)" = 0 ] || echo "warning: $t had $(field "$out" errors) errors" >&2
    p50[$t]=$(awk -v a="${p50[$t]}" -v b="$(field "$out" event_delay_p50_ms)" -v n="$ROUNDS" 'BEGIN{print a+b/n}')
    p99[$t]=$(awk -v a="${p99[$t]}" -v b="$(field "$out" event_delay_p99_ms)" -v n="$ROUNDS" 'BEGIN{print a+b/n}')
    events[$t]=$((${events[$t]} + $(field "$out" events)))
    cpus[$t]=$(awk -v a="${cpus[$t]}" -v b="$before" -v c="$after" 'BEGIN{print a+c-b}')
    echo "  round $r $t: p50 $(field "$out" event_delay_p50_ms) ms p99 $(field "$out" event_delay_p99_ms) ms, $(field "$out" events) events" >&2
  done
done

cat >"$work/unary.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["X-Emulator-TTFT"] = "0s"
wrk.headers["X-Emulator-ITL"] = "0s"
wrk.body = '{"model":"emulated","messages":[{"role":"user","content":"bench"}],"max_tokens":$UNARY_TOKENS,"include_metrics":true}'
LUA
echo "unary: $UNARY_CLIENTS clients, $UNARY_TOKENS-token responses, $DURATION per run" >&2
for r in $(seq "$ROUNDS"); do
  for t in $targets; do
    out=$(wrk -t2 -c"$UNARY_CLIENTS" -d"$DURATION" -s "$work/unary.lua" "${url[$t]}/v1/chat/completions")
    v=$(awk '/Requests\/sec/{print $2}' <<<"$out")
    rps[$t]=$(awk -v a="${rps[$t]}" -v b="$v" -v n="$ROUNDS" 'BEGIN{print a+b/n}')
    echo "  round $r $t: $v requests/s" >&2
  done
done

echo "holding $HOLD open streams through the sidecar..." >&2
( while sleep 0.5; do rss "$sidecar_pid"; echo; done ) >"$work/rss" & sampler=$!
hold=$("$bin" bench --json -c "$HOLD" -d 5s --tokens 20 --itl 500ms "${url[sidecar]}" 2>/dev/null)
kill "$sampler"
hold_rss=$(sort -n "$work/rss" | tail -1)

awk -v dp50="${p50[direct]}" -v sp50="${p50[sidecar]}" -v np50="${p50[nginx]}" \
    -v dp99="${p99[direct]}" -v sp99="${p99[sidecar]}" -v np99="${p99[nginx]}" \
    -v gp50="${p50[go-relay]}" -v gp99="${p99[go-relay]}" -v gev="${events[go-relay]}" -v gcpu="${cpus[go-relay]}" -v grps="${rps[go-relay]}" \
    -v sev="${events[sidecar]}" -v nev="${events[nginx]}" -v scpu="${cpus[sidecar]}" -v ncpu="${cpus[nginx]}" \
    -v drps="${rps[direct]}" -v srps="${rps[sidecar]}" -v nrps="${rps[nginx]}" \
    -v hold="$HOLD" -v herr="$(field "$hold" errors)" -v hrss="$hold_rss" -v streams="$STREAMS" -v itl="$ITL" '
BEGIN {
  printf "\n%-8s %14s %14s %14s %16s\n", "", "event p50 ms", "event p99 ms", "requests/s", "CPU s/1k events"
  printf "%-8s %14.3f %14.3f %14.0f %16s\n", "direct", dp50, dp99, drps, "-"
  printf "%-8s %14.3f %14.3f %14.0f %16.4f\n", "sidecar", sp50, sp99, srps, scpu/(sev/1000)
  printf "%-8s %14.3f %14.3f %14.0f %16.4f\n", "nginx", np50, np99, nrps, ncpu/(nev/1000)
  printf "%-8s %14.3f %14.3f %14.0f %16.4f\n", "go-relay", gp50, gp99, grps, gcpu/(gev/1000)
  printf "\nratios, sidecar / nginx (%d streams at %s, metrics on):\n", streams, itl
  printf "  added event delay p50   %.2f  (target <= 1.0)\n", (sp50-dp50)/(np50-dp50)
  printf "  added event delay p99   %.2f  (target <= 1.5)\n", (sp99-dp99)/(np99-dp99)
  printf "  CPU per 1,000 events    %.2f  (target <= 1.0)\n", (scpu/sev)/(ncpu/nev)
  printf "  unary requests/s        %.2f  (target >= 0.9)\n", srps/nrps
  printf "reference, go-relay / nginx: added p50 %.2f, p99 %.2f, CPU %.2f, unary %.2f\n", \
    (gp50-dp50)/(np50-dp50), (gp99-dp99)/(np99-dp99), (gcpu/gev)/(ncpu/nev), grps/nrps
  printf "  %d open streams: sidecar RSS peak %.0f MB (target <= 256), %s errors\n", hold, hrss, herr
}'
