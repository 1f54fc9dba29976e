#!/usr/bin/env bash
# The load mix at 100 users against the reference, side by side in one run
# (issue 25): `bench/load -npm-share 1` (every user the real npm clients,
# test/npm/npm-user.mjs, so both sides see the same client) against
# `agentry serve`'s demo and against reference-chat/ (the same Assistant and
# Researcher on the Cloudflare reference, wrangler dev / workerd, paced
# alike), in interleaved rounds A R A R …, each on a fresh server and fresh
# data. Prints, per round, runs/s, turns/s, p50/p99 of the first chunk and
# of the end of a turn, the server's peak RSS and CPU, errors, the
# transcript check and the load average; then the ratios (Agentry ÷
# reference for runs/s and turns/s, reference ÷ Agentry for the p99s).
#
#   bench/sidebyside/load100.sh                 # 2 rounds each, 2 min a round: about 30 minutes
#   ROUNDS=1 DURATION=30s bench/sidebyside/load100.sh
#   bench/sidebyside/load100.sh --summary RUN  # the table and ratios of a finished run again
#
# Knobs (environment): ROUNDS (2), USERS (100), DURATION (2m), THINK (1s),
# MIX (research=4,fanout=2,reconnect=1: the actions npm-user.mjs runs), NPM_SHARE (1:
# every user the npm clients; 0: every user bench/load's Go client, which speaks the same
# frames and drives the reference unchanged: the servers' side with a cheap client),
# REF_VIA (direct: the npm clients reach workerd's own socket; proxy:
# wrangler's port, which adds its proxy's hop), WORK (${TMPDIR:-/tmp}/agentry-perf,
# shared with run.sh: the reference's `npm ci` is kept there), RUN
# (WORK/load100-<time>), ports AG_PORT (18821) DBG_PORT (18822) WR_PORT (18823)
# INSP_PORT (18824).
# Needs go, node (20+), npm (the first run does `npm ci` of the reference
# under WORK, and of test/npm when its node_modules are missing), curl and ss.
# Exit status: 0 unless a round failed to run or reported errors.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CHECKOUT=$(cd "$HERE/../.." && pwd)
. "$HERE/lib.sh"
# ---- 4. table and ratios (load100.sh --summary RUN prints them again) ----
# One line per round: tag side load1 (window start→end) runs/s turns/s first-p50 first-p99 end-p50 end-p99 rss-MiB cpu% errors
# check (ok or PROBLEMS, and how many transcripts were read: an npm user still running when the
# drain's bound ends is killed, and its transcript is not read)
row() { # $1 tag
  local f=$RUN/load-$1.txt
  [ -s "$f" ] || { echo "$1 - - - - - - - - - - - missing"; return; }
  awk -v tag="$1" '
    /^load average before:/ { la = $4 }
    /^load average after:/ { lb = $4 }
    /window:/ { for (i = 1; i <= NF; i++) { if ($(i+1) == "turns/s,") t = $i; if ($(i+1) == "child" && $(i+2) == "runs/s") r = $i } }
    /^first chunk:/ { fp50 = $4; fp99 = $10 }
    /^end of turn:/ { ep50 = $5; ep99 = $11 }
    /^server RSS: peak/ { rss = $4 }
    /^server CPU:/ { cpu = $5; sub(/\(/, "", cpu) }
    /^errors: none/ { errs = 0 }
    /^errors:$/ { inerr = 1; errs = 0; next }
    inerr && /^  / { if (match($0, /[0-9]+  e\.g\. /)) errs += substr($0, RSTART, RLENGTH - 7) + 0; next }
    inerr { inerr = 0 }
    /^transcripts:/ { chk = (($0 ~ /nothing lost, nothing doubled/) ? "ok," : "PROBLEMS,") $2 "-read" }
    END { side = (tag ~ /^a/) ? "agentry" : "reference"
          printf "%s %s %s→%s %s %s %s %s %s %s %s %s %s %s\n", tag, side, la, lb, r, t, fp50, fp99, ep50, ep99, rss, cpu, errs, chk }' "$f"
}
summary() {
  if [ -n "${summary_only:-}" ]; then echo "load100: $(head -1 "$RUN/load-a1.txt" | sed 's/^load: //')"
  else echo "load100: $USERS users (npm share $NPM_SHARE), $DURATION a round, mix $MIX, think $THINK, reference via $REF_VIA; $(nproc) cores; commit $(git -C "$CHECKOUT" rev-parse --short HEAD 2>/dev/null)"; fi
  printf "%-5s %-9s %13s %7s %8s %9s %9s %9s %9s %8s %6s %6s %s\n" round side load1-window runs/s turns/s first-p50 first-p99 end-p50 end-p99 rss-MiB cpu% errors check
  for r in $(seq 1 "$ROUNDS"); do for s in a r; do
    row "$s$r" | awk '{ printf "%-5s %-9s %13s %7s %8s %9s %9s %9s %9s %8s %6s %6s %s\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13 }'
  done; done
  for r in $(seq 1 "$ROUNDS"); do row "a$r"; row "r$r"; done | awk '
    function ratio(x, y) { return y > 0 && x > 0 ? sprintf("%.2fx", x / y) : (x > 0 ? "unbounded (0 on the other side)" : "n/a") }
    $4 != "-" { s = $2; n[s]++; runs[s] += $4; turns[s] += $5; fp99[s] += $7; ep99[s] += $9; fp50[s] += $6; ep50[s] += $8 }
    END {
      if (!n["agentry"] || !n["reference"]) { print "ratios: a side has no rounds"; exit }
      a = "agentry"; r = "reference"
      printf "mean: agentry %.1f runs/s, %.1f turns/s, first chunk p99 %.0f ms, end of turn p99 %.0f ms\n", runs[a]/n[a], turns[a]/n[a], fp99[a]/n[a], ep99[a]/n[a]
      printf "mean: reference %.1f runs/s, %.1f turns/s, first chunk p99 %.0f ms, end of turn p99 %.0f ms\n", runs[r]/n[r], turns[r]/n[r], fp99[r]/n[r], ep99[r]/n[r]
      # A side with no turn in the window has no latency, and the reference
      # with no run in it an unbounded throughput ratio: say so.
      printf "ratios (agentry/reference for throughput, reference/agentry for latency): runs/s %s, turns/s %s, first chunk p50 %s, p99 %s, end of turn p50 %s, p99 %s\n",
        ratio(runs[a], runs[r]), ratio(turns[a], turns[r]), ratio(fp50[r], fp50[a]), ratio(fp99[r], fp99[a]), ratio(ep50[r], ep50[a]), ratio(ep99[r], ep99[a])
      if (turns[r] == 0) print "the reference ended no turn in any window: its latencies are unknown (longer than the turns it timed out), its throughput 0"
    }'
}
if [ "${1:-}" = --summary ]; then
  summary_only=1 RUN=${2:?usage: load100.sh --summary RUN}
  ROUNDS=$(find "$RUN" -maxdepth 1 -name 'load-a*.txt' | wc -l)
  summary; exit 0
fi
if ! grep -q '^module github.com/agentry/agentry$' "$CHECKOUT/go.mod" 2>/dev/null; then
  echo "load100.sh: $CHECKOUT is not a checkout of github.com/agentry/agentry" >&2; exit 2
fi
ROUNDS=${ROUNDS:-2} USERS=${USERS:-100} DURATION=${DURATION:-2m} THINK=${THINK:-1s}
MIX=${MIX:-research=4,fanout=2,reconnect=1} REF_VIA=${REF_VIA:-direct} NPM_SHARE=${NPM_SHARE:-1}
WORK=${WORK:-${TMPDIR:-/tmp}/agentry-perf}
RUN=${RUN:-$WORK/load100-$(date +%Y%m%d-%H%M%S)}
AG_PORT=${AG_PORT:-18821} DBG_PORT=${DBG_PORT:-18822} WR_PORT=${WR_PORT:-18823} INSP_PORT=${INSP_PORT:-18824}
CF=$WORK/cf-reference        # the reference harness with its node_modules (as run.sh)
CHAT=$WORK/cf-reference-chat # reference-chat/ on those node_modules
mkdir -p "$RUN" "$WORK/tmp"
export TMPDIR=$WORK/tmp GOTMPDIR=$WORK/tmp
FAILED=0
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$RUN/run.log" >&2; }
fail() { log "FAILED: $*"; FAILED=1; }

for p in $AG_PORT $DBG_PORT $WR_PORT $INSP_PORT; do
  if [ -n "$(ss -ltnH "sport = :$p" 2>/dev/null)" ]; then echo "load100.sh: port $p is in use" >&2; exit 2; fi
done
ulimit -n 65536 2>/dev/null || true

# ---- 1. build agentry and the load generator from this checkout ----
log "build agentry and bench/load from $CHECKOUT (commit $(git -C "$CHECKOUT" rev-parse --short HEAD 2>/dev/null || echo '?'))"
mkdir -p "$RUN/build"
if ! (cd "$CHECKOUT" && go build -o "$RUN/build/agentry" ./cmd/agentry && go build -o "$RUN/build/load" ./bench/load) >"$RUN/build.log" 2>&1; then
  cat "$RUN/build.log" >&2; echo "load100.sh: the build failed" >&2; exit 1
fi

# ---- 2. the npm clients (test/npm) and the reference chat harness ----
if [ ! -d "$CHECKOUT/test/npm/node_modules" ]; then
  log "npm ci in test/npm"
  (cd "$CHECKOUT/test/npm" && npm ci --no-audit --no-fund --loglevel=error) >"$RUN/npm-ci-test.log" 2>&1 \
    || { cat "$RUN/npm-ci-test.log" >&2; exit 1; }
fi
log "reference harness in $CF, chat harness in $CHAT"
cf_harness "$HERE/reference" "$CF" || { echo "load100.sh: npm ci failed" >&2; exit 1; }
rm -rf "$CHAT" && mkdir -p "$CHAT/src"
cp "$HERE/reference-chat/wrangler.jsonc" "$HERE/reference-chat/tsconfig.json" "$CHAT/"
cp "$HERE/reference-chat/src/server.ts" "$HERE/reference/src/turndown-stub.ts" "$CHAT/src/"
ln -s "$CF/node_modules" "$CHAT/node_modules"
log "versions: node $(node --version), wrangler $(cd "$CF" && npx wrangler --version 2>/dev/null | tail -1), $("$CF/node_modules/@cloudflare/workerd-linux-64/bin/workerd" --version), $(go version | cut -d' ' -f3); $(nproc) cores"

# ---- servers ----
WPID= USER_PID= PROXY_PID= DIRECT= APID=
descendants() { local c; for c in $(pgrep -P "$1" 2>/dev/null); do echo "$c"; descendants "$c"; done; }
cmdline() { tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null; }
stop_group() { # stop a process group we started (its leader's PID), TERM then KILL
  local pid=$1 i
  [ -n "$pid" ] || return 0
  kill -TERM -- "-$pid" 2>/dev/null
  for i in $(seq 1 50); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 0.2; done
  kill -KILL -- "-$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  return 0
}
start_ref() { # $1 tag
  local tag=$1 i pid c port
  rm -rf "$CHAT/.wrangler"
  (cd "$CHAT" && WRANGLER_SEND_METRICS=false CLOUDFLARE_CF_FETCH_ENABLED=false exec setsid nohup npx wrangler dev \
     --ip 127.0.0.1 --port "$WR_PORT" --inspector-ip 127.0.0.1 --inspector-port "$INSP_PORT" --local \
     --show-interactive-dev-session=false) >"$RUN/wrangler-$tag.log" 2>&1 &
  WPID=$!
  for i in $(seq 1 240); do grep -q "Ready on" "$RUN/wrangler-$tag.log" 2>/dev/null && break; sleep 0.5; done
  USER_PID= PROXY_PID= DIRECT=
  for i in $(seq 1 20); do
    for pid in $(descendants "$WPID"); do
      c=$(cmdline "$pid")
      case "$c" in
        *workerd*"entry=127.0.0.1:$WR_PORT"*) PROXY_PID=$pid ;;
        *workerd*debug-port*) USER_PID=$pid ;;
      esac
    done
    [ -n "$USER_PID" ] && break; sleep 0.5
  done
  for port in $(ss -ltnpH 2>/dev/null | grep "pid=$USER_PID," | awk '{print $4}' | sed 's/.*://'); do
    if [ "$(curl -s -m 2 "http://127.0.0.1:$port/ping" || true)" = "pong" ]; then DIRECT="127.0.0.1:$port"; break; fi
  done
  if [ -z "$USER_PID" ] || [ -z "$DIRECT" ] || [ "$(curl -s -m 5 "http://127.0.0.1:$WR_PORT/ping")" != pong ]; then
    fail "reference did not start ($tag): $(tail -5 "$RUN/wrangler-$tag.log")"; return 1
  fi
  log "reference $tag: user workerd=$USER_PID proxy workerd=$PROXY_PID direct=$DIRECT"
}
start_agentry() { # $1 tag $2 data
  local tag=$1 data=$2 i
  rm -rf "$data"
  setsid "$RUN/build/agentry" serve --addr "127.0.0.1:$AG_PORT" --data "$data" --debug-addr "127.0.0.1:$DBG_PORT" \
    >"$RUN/agentry-$tag.log" 2>&1 &
  APID=$!
  for i in $(seq 1 100); do
    [ "$(curl -s -o /dev/null -m 1 -w '%{http_code}' "http://127.0.0.1:$AG_PORT/")" != 000 ] && break; sleep 0.1
  done
  if [ "$(curl -s -o /dev/null -m 2 -w '%{http_code}' "http://127.0.0.1:$AG_PORT/")" = 000 ]; then fail "agentry did not start ($tag)"; return 1; fi
  log "agentry $tag: pid=$APID"
}
cleanup() { stop_group "$WPID"; WPID=; stop_group "$APID"; APID=; }
trap cleanup EXIT
trap 'exit 130' INT TERM

# load SIDE TAG: one bench/load run against the running server of SIDE
load() {
  local side=$1 tag=$2 url pid data extra=() rc
  if [ "$side" = ref ]; then
    url=http://127.0.0.1:$WR_PORT; [ "$REF_VIA" = direct ] && url=http://$DIRECT
    pid=$USER_PID data=$CHAT/.wrangler/state
  else
    url=http://127.0.0.1:$AG_PORT pid=$APID data=$RUN/data-$tag extra=(-debug "127.0.0.1:$DBG_PORT")
  fi
  sleep 3 # let start-up settle
  echo "$(cut -d' ' -f1-3 /proc/loadavg)" >"$RUN/loadavg-$tag"
  log "load $tag ($side, $url) load average $(cat "$RUN/loadavg-$tag")"
  "$RUN/build/load" -url "$url" -pid "$pid" -data "$data" "${extra[@]}" -npm-share "$NPM_SHARE" -npm-dir "$CHECKOUT/test/npm" \
    -users "$USERS" -duration "$DURATION" -think "$THINK" -mix "$MIX" -prefix "load100-$tag" \
    >"$RUN/load-$tag.txt" 2>"$RUN/load-$tag.err"
  rc=$?
  echo "$rc" >"$RUN/rc-$tag"
  [ "$rc" = 0 ] || fail "load $tag exited $rc: $(grep -A3 '^errors:' "$RUN/load-$tag.txt" | head -4 | tr '\n' ' ')"
  log "load $tag done, rc=$rc, load average $(cut -d' ' -f1-3 /proc/loadavg)"
}

# ---- 3. interleaved rounds: A R A R … ----
for r in $(seq 1 "$ROUNDS"); do
  if start_agentry "a$r" "$RUN/data-a$r"; then load agentry "a$r"; fi
  stop_group "$APID"; APID=; rm -rf "$RUN/data-a$r"
  if start_ref "r$r"; then load ref "r$r"; fi
  stop_group "$WPID"; WPID=; rm -rf "$CHAT/.wrangler"
done

summary | tee "$RUN/summary.txt"
log "everything is in $RUN"
exit $FAILED
