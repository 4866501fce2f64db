#!/usr/bin/env bash
# Compares timing-sidecar with the proxies people would otherwise put in
# front of an engine, all in front of the same emulated engine on this
# machine, and prints each one's ratio to nginx in the terms the
# performance targets are stated in. Targets:
#   direct           the engine itself (the delay floor)
#   sidecar          timing-sidecar with its defaults (metrics on, access
#                    log on, written to a file as a container runtime
#                    would), sized: with no GOMAXPROCS and no CPU limit it
#                    runs on its default parallelism of 2 (proxy/parallelism.go)
#   sidecar-nolog    the same with --access-log=false
#   sidecar-usage    the defaults with usage records on: a spool on this
#                    machine's disk and a CloudEvents sink (e2e/bench/usagesink)
#   sidecar-unsized  the same as sidecar with GOMAXPROCS=64: Go's own sizing
#                    on a 64-core node with no CPU limit, what an unsized
#                    sidecar would cost beside a GPU engine
#   nginx            proxy_buffering off, upstream keepalive, access log off
#   haproxy          option http-no-delay, http-reuse always
#   caddy            reverse_proxy with flush_interval -1
#   go-rp            Go's net/http/httputil.ReverseProxy (e2e/bench/reverseproxy)
#   go-relay         a Go TCP relay that parses nothing (e2e/bench/tcprelay):
#                    the floor for any proxy written in Go
#
#   e2e/bench/compare.sh     (installs nginx, haproxy, caddy and wrk with
#                             apt-get if missing)
#
# With BEFORE=REV (a git revision), REV's sidecar is built too and run as
# before and before-usage, the same as sidecar and sidecar-usage: a
# change's before and after, from one run. TARGETS picks targets (all by
# default; direct and nginx are always run: every ratio needs them).
#
# Settings (environment): STREAMS=200 ITL=20ms TOKENS=100 DURATION=10s ROUNDS=3
# AB_ROUNDS=7 (rounds of each side-by-side measurement)
# UNARY_CLIENTS=32 UNARY_TOKENS=64 HOLD=5000 (open streams for the memory test).
# Loads alternate between the targets, round after round, each round in
# a rotated order, to cancel machine drift.
set -euo pipefail
cd "$(dirname "$0")/../.."

STREAMS=${STREAMS:-200} ITL=${ITL:-20ms} TOKENS=${TOKENS:-100} DURATION=${DURATION:-10s}
ROUNDS=${ROUNDS:-3} AB_ROUNDS=${AB_ROUNDS:-7} UNARY_CLIENTS=${UNARY_CLIENTS:-32} UNARY_TOKENS=${UNARY_TOKENS:-64} HOLD=${HOLD:-5000}

if ! command -v nginx >/dev/null || ! command -v wrk >/dev/null || ! command -v haproxy >/dev/null || ! command -v caddy >/dev/null; then
  echo "installing nginx, haproxy, caddy and wrk..." >&2
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nginx-light haproxy caddy wrk >/dev/null
fi
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

work=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

bin=$work/timing-sidecar
.ci/build "$bin"
CGO_ENABLED=0 go build -o "$work/tcprelay" ./e2e/bench/tcprelay
CGO_ENABLED=0 go build -o "$work/reverseproxy" ./e2e/bench/reverseproxy
CGO_ENABLED=0 go build -o "$work/usagesink" ./e2e/bench/usagesink
if [ -n "${BEFORE:-}" ]; then
  mkdir "$work/before-src"
  git archive "$BEFORE" | tar -x -C "$work/before-src"
  (cd "$work/before-src" && VERSION=before COMMIT=$(git -C "$OLDPWD" rev-parse "$BEFORE") .ci/build "$work/timing-sidecar-before")
fi
ENGINE=127.0.0.1:18000 SIDECAR=127.0.0.1:18001 ADMIN=127.0.0.1:18002 NGINX=127.0.0.1:18003 RELAY=127.0.0.1:18004
NOLOG=127.0.0.1:18008 NOLOG_ADMIN=127.0.0.1:18009 HAPROXY=127.0.0.1:18005 CADDY=127.0.0.1:18006 GORP=127.0.0.1:18007
UNSIZED=127.0.0.1:18010 UNSIZED_ADMIN=127.0.0.1:18011 SINK=127.0.0.1:18012
USAGE=127.0.0.1:18013 USAGE_ADMIN=127.0.0.1:18014 BEFORE_ADDR=127.0.0.1:18015 BEFORE_ADMIN=127.0.0.1:18016
BEFORE_USAGE=127.0.0.1:18017 BEFORE_USAGE_ADMIN=127.0.0.1:18018

"$bin" emulate --listen "$ENGINE" 2>"$work/engine.log" & pids+=($!); engine_pid=$!
# The defaults: the access log goes to a file, as a container runtime's
# log capture would take it.
"$bin" --listen "$SIDECAR" --admin-listen "$ADMIN" --upstream "http://$ENGINE" \
  --readiness-interval 1h >"$work/access.log" 2>"$work/sidecar.log" & pids+=($!); sidecar_pid=$!
"$bin" --listen "$NOLOG" --admin-listen "$NOLOG_ADMIN" --upstream "http://$ENGINE" --access-log=false \
  --readiness-interval 1h 2>"$work/sidecar-nolog.log" & pids+=($!); nolog_pid=$!
# Unsized: the defaults with GOMAXPROCS=64, the parallelism Go gives itself
# on a 64-core node with no CPU limit (the sidecar keeps a GOMAXPROCS it is
# given). On this machine's two cores it shows the CPU that 64 Ps cost, not
# the wake-ups a big node would spread over other cores.
GOMAXPROCS=64 "$bin" --listen "$UNSIZED" --admin-listen "$UNSIZED_ADMIN" --upstream "http://$ENGINE" \
  --readiness-interval 1h >"$work/access-unsized.log" 2>"$work/sidecar-unsized.log" & pids+=($!); unsized_pid=$!
# Usage records on: the spool on this machine's disk (the manifests mount
# an emptyDir), records sent to a sink that keeps up.
"$work/usagesink" --listen "$SINK" 2>"$work/usagesink.log" & pids+=($!)
usage_flags=(--usage-spool-dir "$work/spool" --usage-cloudevents-endpoint "http://$SINK/")
mkdir "$work/spool" "$work/spool-before"
"$bin" --listen "$USAGE" --admin-listen "$USAGE_ADMIN" --upstream "http://$ENGINE" --readiness-interval 1h "${usage_flags[@]}" \
  >"$work/access-usage.log" 2>"$work/sidecar-usage.log" & pids+=($!); usage_pid=$!
before_pid="" before_usage_pid=""
if [ -n "${BEFORE:-}" ]; then
  "$work/timing-sidecar-before" --listen "$BEFORE_ADDR" --admin-listen "$BEFORE_ADMIN" --upstream "http://$ENGINE" \
    --readiness-interval 1h >"$work/access-before.log" 2>"$work/before.log" & pids+=($!); before_pid=$!
  "$work/timing-sidecar-before" --listen "$BEFORE_USAGE" --admin-listen "$BEFORE_USAGE_ADMIN" --upstream "http://$ENGINE" \
    --readiness-interval 1h --usage-spool-dir "$work/spool-before" --usage-cloudevents-endpoint "http://$SINK/" \
    >"$work/access-before-usage.log" 2>"$work/before-usage.log" & pids+=($!); before_usage_pid=$!
fi
cat >"$work/haproxy.cfg" <<HAPROXY
global
  maxconn 9000
defaults
  mode http
  timeout connect 5s
  timeout client 1h
  timeout server 1h
  option http-no-delay
  http-reuse always
frontend clients
  bind $HAPROXY
  default_backend engine
backend engine
  server engine $ENGINE
HAPROXY
haproxy -db -f "$work/haproxy.cfg" 2>"$work/haproxy.log" & pids+=($!); haproxy_pid=$!
cat >"$work/Caddyfile" <<CADDY
{
  admin off
  auto_https off
}
http://$CADDY {
  reverse_proxy $ENGINE {
    flush_interval -1
  }
}
CADDY
HOME=$work XDG_DATA_HOME=$work XDG_CONFIG_HOME=$work caddy run --config "$work/Caddyfile" --adapter caddyfile 2>"$work/caddy.log" & pids+=($!); caddy_pid=$!
"$work/reverseproxy" --listen "$GORP" --upstream "http://$ENGINE" 2>"$work/go-rp.log" & pids+=($!); gorp_pid=$!
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

# procs PID: the process and its children (nginx's workers).
procs() { echo "$1" $(pgrep -P "$1" || true); }
# cpu PID: CPU seconds of the process tree, from the scheduler's
# nanosecond count of every thread (/proc/PID/stat counts in 10 ms ticks:
# too coarse for a few percent over a 10 s run). The proxies keep their
# threads, so none of the time leaves with an exited one.
cpu() { local p; for p in $(procs "$1"); do cat /proc/"$p"/task/*/schedstat 2>/dev/null; done | awk '{t += $1} END {printf "%.6f", t / 1e9}'; }
# rss PID: resident MB of the process tree.
rss() { local k=0 v; for p in $(procs "$1"); do v=$(awk '/VmRSS/{print $2}' "/proc/$p/status" 2>/dev/null) && [ -n "$v" ] && k=$((k + v)); done; awk -v k="$k" 'BEGIN{printf "%.1f", k/1024}'; }
field() { grep -o "\"$2\":[-0-9.e+]*" <<<"$1" | cut -d: -f2; }

all="direct sidecar sidecar-nolog sidecar-usage sidecar-unsized nginx haproxy caddy go-rp go-relay"
[ -z "${BEFORE:-}" ] || all="$all before before-usage"
targets=""
for t in $all; do
  case " direct nginx ${TARGETS:-$all} " in *" $t "*) targets="$targets $t" ;; esac
done
targets=${targets# }
declare -A url=([direct]="http://$ENGINE" [sidecar]="http://$SIDECAR" [sidecar-nolog]="http://$NOLOG"
  [sidecar-usage]="http://$USAGE" [sidecar-unsized]="http://$UNSIZED" [nginx]="http://$NGINX" [haproxy]="http://$HAPROXY"
  [caddy]="http://$CADDY" [go-rp]="http://$GORP" [go-relay]="http://$RELAY" [before]="http://$BEFORE_ADDR"
  [before-usage]="http://$BEFORE_USAGE")
declare -A pid=([direct]=$engine_pid [sidecar]=$sidecar_pid [sidecar-nolog]=$nolog_pid [sidecar-usage]=$usage_pid
  [sidecar-unsized]=$unsized_pid [nginx]=$nginx_pid [haproxy]=$haproxy_pid [caddy]=$caddy_pid [go-rp]=$gorp_pid
  [go-relay]=$relay_pid [before]=$before_pid [before-usage]=$before_usage_pid)
# Each round's figures go to one file, a line per target and load; the
# summary takes, for every figure and every ratio, the median over rounds,
# and each ratio is taken within a round (the targets run back to back), so
# a burst of noise on the shared machine moves one round, not the result.
results=$work/results
# rotated R: the targets in round R's order. Each round starts one target
# further along, so no target always follows the same one (the direct
# run, which saturates the engine, would otherwise always precede the
# sidecar's).
rotated() { local a=($targets) n i; n=${#a[@]}; for ((i = 0; i < n; i++)); do echo "${a[$(((i + $1 - 1) % n))]}"; done; }

echo "streaming: $STREAMS streams, $TOKENS tokens at $ITL, $DURATION per run, $ROUNDS rounds" >&2
for r in $(seq "$ROUNDS"); do
  for t in $(rotated "$r"); do
    before=$(cpu "${pid[$t]}")
    out=$("$bin" bench --json -c "$STREAMS" -d "$DURATION" --tokens "$TOKENS" --itl "$ITL" "${url[$t]}" 2>/dev/null)
    after=$(cpu "${pid[$t]}")
    [ "$(field "$out" errors)" = 0 ] || echo "warning: $t had $(field "$out" errors) errors" >&2
    echo "stream $r $t $(field "$out" event_delay_p50_ms) $(field "$out" event_delay_p99_ms) $(field "$out" events) $before $after" >>"$results"
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
  for t in $(rotated "$r"); do
    before=$(cpu "${pid[$t]}")
    out=$(wrk -t2 -c"$UNARY_CLIENTS" -d"$DURATION" -s "$work/unary.lua" "${url[$t]}/v1/chat/completions")
    after=$(cpu "${pid[$t]}")
    v=$(awk '/Requests\/sec/{print $2}' <<<"$out")
    echo "unary $r $t $v $(awk '/requests in/{print $1}' <<<"$out") $before $after" >>"$results"
    echo "  round $r $t: $v requests/s" >&2
  done
done

# Targets run one after the other see different machines: on a shared
# host the CPU per event of one target moves by a third over a few
# minutes. So each ratio a target is stated in is also measured with the
# two under the same load at the same time, half the clients on each:
# whatever disturbs the machine disturbs both alike, and each round's
# ratio compares two figures taken over the same seconds. The load that
# starts first alternates between rounds. Pairs: the sidecar and nginx
# (the targets), the Go relay and nginx (what Go itself costs here), the
# sidecar and sidecar-nolog (the access log), sidecar-usage and the
# sidecar (usage records), and with BEFORE the same for REV.
pairs="sidecar:nginx go-relay:nginx sidecar:sidecar-nolog sidecar-usage:sidecar"
[ -z "${BEFORE:-}" ] || pairs="$pairs before:nginx before-usage:before"
# side A B PATH CMD...: runs CMD against sidecars A and B at once, each
# given its URL with PATH appended as the last argument, writing their
# outputs to ab-A and ab-B.
side() {
  local order=("$1" "$2") path=$3 p=() t
  shift 3
  [ $((r % 2)) = 1 ] || order=("${order[1]}" "${order[0]}")
  for t in "${order[@]}"; do "$@" "${url[$t]}$path" >"$work/ab-$t" 2>/dev/null & p+=($!); done
  wait "${p[@]}"
}
for pair in $pairs; do
  a=${pair%:*} b=${pair#*:}
  case " $targets " in *" $a "*) ;; *) continue ;; esac
  case " $targets " in *" $b "*) ;; *) continue ;; esac
  echo "$a against $b, loaded side by side, $AB_ROUNDS rounds" >&2
  for r in $(seq "$AB_ROUNDS"); do
    b1=$(cpu "${pid[$a]}") b2=$(cpu "${pid[$b]}")
    side "$a" "$b" "" "$bin" bench --json -c $((STREAMS / 2)) -d "$DURATION" --tokens "$TOKENS" --itl "$ITL"
    a1=$(cpu "${pid[$a]}") a2=$(cpu "${pid[$b]}")
    echo "abstream $a:$b $r $(field "$(cat "$work/ab-$a")" events) $b1 $a1 $(field "$(cat "$work/ab-$b")" events) $b2 $a2" >>"$results"
    b1=$(cpu "${pid[$a]}") b2=$(cpu "${pid[$b]}")
    side "$a" "$b" /v1/chat/completions wrk -t1 -c$((UNARY_CLIENTS / 2)) -d"$DURATION" -s "$work/unary.lua"
    a1=$(cpu "${pid[$a]}") a2=$(cpu "${pid[$b]}")
    echo "abunary $a:$b $r $(awk '/requests in/{print $1}' "$work/ab-$a") $b1 $a1 $(awk '/requests in/{print $1}' "$work/ab-$b") $b2 $a2" >>"$results"
    echo "  round $r: $(tail -2 "$results" | awk '{printf "%s %s/%s  ", $1, $4, $7}')" >&2
  done
done

echo "holding $HOLD open streams through the sidecar..." >&2
( while sleep 0.5; do rss "$sidecar_pid"; echo; done ) >"$work/rss" & sampler=$!
hold=$("$bin" bench --json -c "$HOLD" -d 5s --tokens 20 --itl 500ms "${url[sidecar]}" 2>/dev/null)
kill "$sampler"
hold_rss=$(sort -n "$work/rss" | tail -1)

awk -v targets="$targets" -v rounds="$ROUNDS" -v hold="$HOLD" -v herr="$(field "$hold" errors)" -v hrss="$hold_rss" \
  -v streams="$STREAMS" -v itl="$ITL" '
$1 == "stream" { p50[$2,$3] = $4; p99[$2,$3] = $5; cpuev[$2,$3] = ($8 - $7) * 1e6 / $6 }
$1 == "unary" { rps[$2,$3] = $4; cpureq[$2,$3] = ($7 - $6) * 1e6 / $5 }
# side by side: fields are the pair A:B, the round, then count, CPU
# before, CPU after for A, then the same for B
$1 ~ /^ab/ && !($2 in abn) { abn[$2] = 0; pairs[++npairs] = $2 }
$1 == "abstream" { abn[$2]++; abev[$2,$3] = ($6 - $5) / $4 / (($9 - $8) / $7) }
$1 == "abunary" { abrps[$2,$3] = $4 / $7; abreq[$2,$3] = ($6 - $5) / $4 / (($9 - $8) / $7) }
# median(a, n), span(a, n): the median, and the lowest and highest, of the
# n values in a[1..n] (a is left as it is)
function median(a, n,   i, j, x, c) {
  for (i = 1; i <= n; i++) { x = a[i]; for (j = i - 1; j >= 1 && c[j] > x; j--) c[j+1] = c[j]; c[j+1] = x }
  return n % 2 ? c[(n+1)/2] : (c[n/2] + c[n/2+1]) / 2
}
function span(a, n,   i, lo, hi) {
  for (i = 1; i <= n; i++) { if (i == 1 || a[i] < lo) lo = a[i]; if (i == 1 || a[i] > hi) hi = a[i] }
  return sprintf("%.3f, %.3f", lo, hi)
}
function goal(g) { return g == "" ? "" : " (target " g ")" }
# med(name, t): the median over rounds of figure name for target t
function med(name, t,   r, v) {
  for (r = 1; r <= rounds; r++) {
    if (name == "p50") v[r] = p50[r,t]; else if (name == "p99") v[r] = p99[r,t]
    else if (name == "cpuev") v[r] = cpuev[r,t]; else if (name == "rps") v[r] = rps[r,t]; else v[r] = cpureq[r,t]
  }
  return median(v, rounds)
}
# ratio(kind, t, base): the median over rounds of that round'"'"'s ratio of t to base
function ratio(kind, t, base,   r, v, d) {
  for (r = 1; r <= rounds; r++) {
    d = "direct"
    if (kind == "p50") v[r] = (p50[r,t] - p50[r,d]) / (p50[r,base] - p50[r,d])
    else if (kind == "p99") v[r] = (p99[r,t] - p99[r,d]) / (p99[r,base] - p99[r,d])
    else if (kind == "cpu") v[r] = cpuev[r,t] / cpuev[r,base]
    else v[r] = rps[r,t] / rps[r,base]
  }
  return median(v, rounds)
}
END {
  n = split(targets, name, " ")
  printf "\nmedians over %d rounds:\n", rounds
  printf "%-16s %12s %12s %12s %16s %18s\n", "", "event p50 ms", "event p99 ms", "requests/s", "CPU us/event", "CPU us/unary req"
  for (i = 1; i <= n; i++) { t = name[i]
    printf "%-16s %12.3f %12.3f %12.0f %16s %18s\n", t, med("p50", t), med("p99", t), med("rps", t), \
      (t == "direct" ? "-" : sprintf("%.1f", med("cpuev", t))), (t == "direct" ? "-" : sprintf("%.1f", med("cpureq", t))) }
  ng = "nginx"
  printf "\nratios to nginx, each the median over rounds of that round'"'"'s ratio (%d streams at %s, metrics on;\n", streams, itl
  printf "lower is better but unary, where higher is):\n"
  printf "%-16s %14s %14s %14s %14s\n", "", "added p50", "added p99", "CPU/event", "unary req/s"
  best50 = ""; best99 = ""; bestcpu = ""; bestrps = ""
  for (i = 1; i <= n; i++) { t = name[i]; if (t == "direct") continue
    a50 = ratio("p50", t, ng); a99 = ratio("p99", t, ng); c = ratio("cpu", t, ng); u = ratio("rps", t, ng)
    printf "%-16s %14.2f %14.2f %14.2f %14.2f\n", t, a50, a99, c, u
    if (t ~ /^(sidecar|before)/ || t == "go-relay") continue # peers: nginx, haproxy, caddy, go-rp
    if (best50 == "" || a50 < b50) { best50 = t; b50 = a50 }
    if (best99 == "" || a99 < b99) { best99 = t; b99 = a99 }
    if (bestcpu == "" || c < bc) { bestcpu = t; bc = c }
    if (bestrps == "" || u > bu) { bestrps = t; bu = u }
  }
  printf "best peer per column: added p50 %s, added p99 %s, CPU %s, unary %s\n", best50, best99, bestcpu, bestrps
  # the targets side-by-side ratios are held to: unary requests/s, CPU per event
  rpsgoal["sidecar:nginx"] = ">= 0.95"; cpugoal["sidecar:nginx"] = "<= 1.3"
  rpsgoal["sidecar-usage:sidecar"] = ">= 0.95"; cpugoal["sidecar-usage:sidecar"] = "<= 1.05"
  for (i = 1; i <= npairs; i++) { pr = pairs[i]; split(pr, ab, ":"); n = abn[pr]
    for (r = 1; r <= n; r++) { x1[r] = abrps[pr,r]; x2[r] = abev[pr,r]; x3[r] = abreq[pr,r] }
    printf "%s / %s, run one after the other (median of the rounds): unary requests/s %.2f, CPU per event %.2f\n", \
      ab[1], ab[2], ratio("rps", ab[1], ab[2]), ratio("cpu", ab[1], ab[2])
    printf "%s / %s, side by side (median of %d rounds, [lowest, highest]): unary requests/s %.3f [%s]%s, CPU per event %.3f [%s]%s, CPU per unary request %.3f [%s]\n", \
      ab[1], ab[2], n, median(x1, n), span(x1, n), goal(rpsgoal[pr]), median(x2, n), span(x2, n), goal(cpugoal[pr]), median(x3, n), span(x3, n)
  }
  printf "%d open streams: sidecar RSS peak %.0f MB (target <= 256), %s errors\n", hold, hrss, herr
}' "$results"
