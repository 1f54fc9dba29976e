#!/usr/bin/env bash
# Side-by-side performance run: Agentry (agentry-ref, built from this
# checkout) against the Cloudflare Agents reference (reference/, wrangler
# dev / workerd), both driven by the reference's own, unchanged bench.mjs
# (npm AgentClient over WebSocket, node:http over HTTP), loopback only.
#
#   bench/sidebyside/run.sh            # from anywhere in the checkout
#
# Rounds alternate the servers A R A R … A (Agentry brackets every reference
# round), each on a fresh server and a fresh data folder, so that the
# machine's noise hits both. Then Agentry-only scenarios: fan-out 1,000,
# replay of 1,000 retained runs, recovery of one parent with 1,000 running
# children after SIGKILL. Prints a table with both columns and the ratios;
# the last line is `perf: awaited ratio Xx, fanout100 ratio Yx, replay200 ratio Zx`.
#
# Knobs (environment): ROUNDS (3), SEQ (200), WARM (20), NOOP (200),
# FAN (10:20,50:10,100:10), REPLAY_REPS (20), NUDGE_AFTER_MS (15000),
# BIG (1), BIG_SEQ (1000), BIG_FAN (1000:3), BIG_REPLAY_REPS (10),
# RECOVERY (1), RECOVERY_N (1000), RECOVERY_REPS (3), WORK (${TMPDIR:-/tmp}/agentry-perf),
# RUN (WORK/run-<time>), ports WR_PORT (18810) AG_PORT (18811)
# INSP_PORT (18812) REC_PORT (18813), CF_SRC (the reference harness: reference/), WATCHDOG_S (60).
# Needs go, node (20+), npm (the first run does `npm ci` of the reference
# under WORK), curl and ss.
# Exit status: 0 unless something failed to run.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CHECKOUT=$(cd "$HERE/../.." && pwd)
. "$HERE/lib.sh"
if ! grep -q '^module github.com/agentry/agentry$' "$CHECKOUT/go.mod" 2>/dev/null; then
  echo "run.sh: $CHECKOUT is not a checkout of github.com/agentry/agentry" >&2; exit 2
fi
CF_SRC=$(cd "${CF_SRC:-$HERE/reference}" && pwd)
WORK=${WORK:-${TMPDIR:-/tmp}/agentry-perf}
RUN=${RUN:-$WORK/run-$(date +%Y%m%d-%H%M%S)}
ROUNDS=${ROUNDS:-3}
export SEQ=${SEQ:-200} WARM=${WARM:-20} NOOP=${NOOP:-200} FAN=${FAN:-10:20,50:10,100:10}
export REPLAY_REPS=${REPLAY_REPS:-20} NUDGE_AFTER_MS=${NUDGE_AFTER_MS:-15000}
BIG=${BIG:-1} BIG_SEQ=${BIG_SEQ:-1000} BIG_FAN=${BIG_FAN:-1000:3} BIG_REPLAY_REPS=${BIG_REPLAY_REPS:-10}
RECOVERY=${RECOVERY:-1} RECOVERY_N=${RECOVERY_N:-1000} RECOVERY_REPS=${RECOVERY_REPS:-3}
WR_PORT=${WR_PORT:-18810} AG_PORT=${AG_PORT:-18811} INSP_PORT=${INSP_PORT:-18812} REC_PORT=${REC_PORT:-18813}
CF=$WORK/cf-reference
BIN=$RUN/build/agentry-ref-bin
mkdir -p "$RUN" "$WORK/tmp"
export TMPDIR=$WORK/tmp GOTMPDIR=$WORK/tmp   # temporary files of go, npm, node stay under WORK
FAILED=0
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$RUN/run.log" >&2; }
fail() { log "FAILED: $*"; FAILED=1; }

for p in $WR_PORT $AG_PORT $INSP_PORT $REC_PORT; do
  if [ -n "$(ss -ltnH "sport = :$p" 2>/dev/null)" ]; then echo "run.sh: port $p is in use" >&2; exit 2; fi
done

# ---- 1. build agentry-ref (a command of this module) ----
log "build agentry-ref from $CHECKOUT (commit $(git -C "$CHECKOUT" rev-parse --short HEAD 2>/dev/null || echo '?'))"
rm -rf "$RUN/build" && mkdir -p "$RUN/build"
if ! (cd "$CHECKOUT" && go build -o "$BIN" ./bench/sidebyside/agentry-ref) >"$RUN/build.log" 2>&1; then
  cat "$RUN/build.log" >&2; echo "run.sh: agentry-ref does not build" >&2; exit 1
fi

# ---- 2. the reference harness: a copy with npm ci (node_modules kept while the lock file is unchanged) ----
log "reference harness in $CF"
cf_harness "$CF_SRC" "$CF" || { echo "run.sh: npm ci failed" >&2; exit 1; }
cmp -s "$CF_SRC/bench.mjs" "$CF/bench.mjs" || { echo "run.sh: bench.mjs copy differs" >&2; exit 1; }
log "driver: $CF/bench.mjs sha256 $(sha256sum "$CF/bench.mjs" | cut -c1-16) (unchanged copy of $CF_SRC/bench.mjs)"
log "versions: node $(node --version), wrangler $(cd "$CF" && npx wrangler --version 2>/dev/null | tail -1), $("$CF/node_modules/@cloudflare/workerd-linux-64/bin/workerd" --version), $(go version | cut -d' ' -f3)"

# ---- load sampler (every 5 s) ----
( while :; do echo "$(date +%s.%N) $(cut -d' ' -f1-3 /proc/loadavg)"; sleep 5; done ) >"$RUN/loadavg.log" 2>/dev/null &
SAMPLER=$!

# ---- servers ----
WPID= NODE_PID= PROXY_PID= USER_PID= DIRECT= APID=
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
  rm -rf "$CF/.wrangler/state"
  (cd "$CF" && WRANGLER_SEND_METRICS=false CLOUDFLARE_CF_FETCH_ENABLED=false exec setsid nohup npx wrangler dev \
     --ip 127.0.0.1 --port "$WR_PORT" --inspector-ip 127.0.0.1 --inspector-port "$INSP_PORT" --local \
     --show-interactive-dev-session=false) >"$RUN/wrangler-$tag.log" 2>&1 &
  WPID=$!
  for i in $(seq 1 240); do grep -q "Ready on" "$RUN/wrangler-$tag.log" 2>/dev/null && break; sleep 0.5; done
  NODE_PID= PROXY_PID= USER_PID= DIRECT=
  for i in $(seq 1 20); do
    for pid in $(descendants "$WPID"); do
      c=$(cmdline "$pid")
      case "$c" in
        *wrangler-dist/cli.js*) NODE_PID=$pid ;;
        *workerd*"entry=127.0.0.1:$WR_PORT"*) PROXY_PID=$pid ;;
        *workerd*debug-port*) USER_PID=$pid ;;
      esac
    done
    [ -n "$USER_PID" ] && [ -n "$PROXY_PID" ] && break; sleep 0.5
  done
  for port in $(ss -ltnpH 2>/dev/null | grep "pid=$USER_PID," | awk '{print $4}' | sed 's/.*://'); do
    if [ "$(curl -s -m 2 "http://127.0.0.1:$port/ping" || true)" = "pong" ]; then DIRECT="127.0.0.1:$port"; break; fi
  done
  if [ -z "$USER_PID" ] || [ -z "$DIRECT" ] || [ "$(curl -s -m 5 "http://127.0.0.1:$WR_PORT/ping")" != pong ]; then
    fail "reference did not start ($tag): $(tail -5 "$RUN/wrangler-$tag.log")"; return 1
  fi
  log "reference $tag: wrangler node=$NODE_PID proxy workerd=$PROXY_PID user workerd=$USER_PID direct=$DIRECT"
}
stop_ref() { stop_group "$WPID"; WPID=; }
start_agentry() { # $1 tag $2 data
  local tag=$1 data=$2 i
  rm -rf "$data"
  setsid "$BIN" -addr "127.0.0.1:$AG_PORT" -data "$data" >"$RUN/agentry-$tag.log" 2>&1 &
  APID=$!
  for i in $(seq 1 100); do [ "$(curl -s -m 1 "http://127.0.0.1:$AG_PORT/ping")" = pong ] && break; sleep 0.1; done
  if [ "$(curl -s -m 2 "http://127.0.0.1:$AG_PORT/ping")" != pong ]; then fail "agentry-ref did not start ($tag)"; return 1; fi
  log "agentry $tag: pid=$APID"
}
stop_agentry() { stop_group "$APID"; APID=; }
cleanup() { stop_ref; stop_agentry; kill "$SAMPLER" 2>/dev/null; wait "$SAMPLER" 2>/dev/null; }
trap cleanup EXIT
trap 'exit 130' INT TERM

vmrss() { awk '/^VmRSS/{print $2}' "/proc/$1/status" 2>/dev/null || echo null; }
dub() { local v; v=$(du -sb "$1" 2>/dev/null | cut -f1); echo "${v:-0}"; }

# bench SIDE TAG ROUND [ENV…]: one bench.mjs invocation against the running server of SIDE
bench() {
  local side=$1 tag=$2 round=$3; shift 3
  local host direct upid ppid npid state t0 t1 rc du0 du1 l0 l1 files rssReady
  if [ "$side" = ref ]; then host=127.0.0.1:$WR_PORT direct=$DIRECT upid=$USER_PID ppid=$PROXY_PID npid=$NODE_PID state=$CF/.wrangler/state
  else host=127.0.0.1:$AG_PORT direct=127.0.0.1:$AG_PORT upid=$APID ppid= npid= state=$AGDATA; fi
  sleep 3 # let start-up settle before the idle memory sample (as the reference's run.sh)
  rssReady="{\"server\":$(vmrss "$upid"),\"proxy\":$( [ -n "$ppid" ] && vmrss "$ppid" || echo null),\"node\":$( [ -n "$npid" ] && vmrss "$npid" || echo null)}"
  du0=$(dub "$state"); l0=$(cut -d' ' -f1-3 /proc/loadavg); t0=$(date +%s.%N)
  log "bench $tag (round $round, $side) load $l0"
  (cd "$CF" && env "$@" TAG="$tag" OUT="$RUN/results-$tag.json" node bench.mjs "$host" "$direct" "$upid" "$ppid" "$npid") >"$RUN/bench-$tag.out" 2>&1 &
  local bpid=$! wd=
  if [ "$side" = ref ]; then
    # Hang watchdog for the reference (workerd 2026-04-26 sometimes holds a request to a parent DO until
    # another request reaches that parent; bench.mjs nudges only its run/fan-out requests): when wrangler
    # has logged no request for WATCHDOG_S seconds, send one /noop to the parents of the unwatched
    # requests (count before the replay: <tag>-seq; noop phase: <tag>-noop). Every nudge is logged.
    ( last=$(stat -c %s "$RUN/wrangler-$tag.log"); quiet=0
      while kill -0 "$bpid" 2>/dev/null; do
        sleep 1; now=$(stat -c %s "$RUN/wrangler-$tag.log")
        if [ "$now" = "$last" ]; then quiet=$((quiet + 1)); else quiet=0; last=$now; fi
        if [ "$quiet" -ge "${WATCHDOG_S:-60}" ]; then
          echo "$(date +%s) quiet ${quiet}s -> /noop to $tag-seq and $tag-noop" >>"$RUN/watchdog-$tag.log"
          curl -s -m 120 "http://127.0.0.1:$WR_PORT/agents/assistant/$tag-seq/noop" >/dev/null &
          curl -s -m 120 "http://127.0.0.1:$WR_PORT/agents/assistant/$tag-noop/noop" >/dev/null &
          quiet=0
        fi
      done ) &
    wd=$!
  fi
  wait "$bpid"; rc=$?
  [ -n "$wd" ] && { kill "$wd" 2>/dev/null; wait "$wd" 2>/dev/null; }
  t1=$(date +%s.%N); l1=$(cut -d' ' -f1-3 /proc/loadavg); du1=$(dub "$state")
  if [ "$side" = ref ]; then files=$(find "$state" -name '*.sqlite' 2>/dev/null | wc -l); else files=$(find "$state" -type f 2>/dev/null | wc -l); fi
  [ $rc = 0 ] || fail "bench $tag exited $rc: $(tail -3 "$RUN/bench-$tag.out")"
  log "bench $tag done in $(awk "BEGIN{printf \"%.1f\", $t1 - $t0}") s, rc=$rc, load $l1, state $du0 -> $du1 B ($files files)"
  cat >"$RUN/meta-$tag.json" <<EOF
{"side":"$side","tag":"$tag","round":$round,"rc":$rc,"t0":$t0,"t1":$t1,"loadBefore":"$l0","loadAfter":"$l1",
 "stateBytesBefore":$du0,"stateBytesAfter":$du1,"stateFiles":$files,"rssReadyKiB":$rssReady,
 "env":"$*","seq":${SEQ_OVERRIDE:-$SEQ},"warm":$WARM,"fan":"${FAN_OVERRIDE:-$FAN}"}
EOF
}

# ---- 3. interleaved rounds: A R A R … A ----
for r in $(seq 1 "$ROUNDS") $((ROUNDS + 1)); do
  AGDATA=$RUN/agentry-data-a$r
  if start_agentry "a$r" "$AGDATA"; then bench agentry "a$r" "$r"; fi
  stop_agentry; echo "{\"stateBytesAfterStop\":$(dub "$AGDATA")}" >"$RUN/stop-a$r.json"
  rm -rf "$AGDATA"
  [ "$r" -le "$ROUNDS" ] || break
  if start_ref "r$r"; then bench ref "r$r" "$r"; fi
  stop_ref; echo "{\"stateBytesAfterStop\":$(dub "$CF/.wrangler/state")}" >"$RUN/stop-r$r.json"
  rm -rf "$CF/.wrangler/state"
done

# ---- 4. Agentry-only: fan-out 1,000 and replay of BIG_SEQ retained runs (same driver) ----
if [ "$BIG" = 1 ]; then
  AGDATA=$RUN/agentry-data-big
  if start_agentry big "$AGDATA"; then
    SEQ_OVERRIDE=$BIG_SEQ FAN_OVERRIDE=$BIG_FAN bench agentry big 0 SEQ="$BIG_SEQ" NOOP=50 FAN="$BIG_FAN" REPLAY_REPS="$BIG_REPLAY_REPS"
  fi
  stop_agentry; rm -rf "$AGDATA"
fi

# ---- 5. Agentry-only: recovery of one parent with RECOVERY_N running children after SIGKILL ----
if [ "$RECOVERY" = 1 ]; then
  log "recovery: $RECOVERY_N running children, SIGKILL, restart x$RECOVERY_REPS"
  node "$HERE/recovery.mjs" "$BIN" "$REC_PORT" "$RUN/recovery" "$RECOVERY_N" "$RECOVERY_REPS" >"$RUN/recovery.out" 2>&1 \
    || fail "recovery: $(tail -3 "$RUN/recovery.out")"
  tail -n 4 "$RUN/recovery.out" | tee -a "$RUN/run.log" >&2
  rm -rf "$RUN/recovery/fixture" "$RUN/recovery"/data-*
fi

kill "$SAMPLER" 2>/dev/null; wait "$SAMPLER" 2>/dev/null
# ---- 6. table ----
node "$HERE/summarize.mjs" "$RUN" | tee "$RUN/summary.txt" || FAILED=1
exit $FAILED
