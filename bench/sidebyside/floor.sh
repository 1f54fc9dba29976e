#!/usr/bin/env bash
# The npm client's floor for a connect replay: how long the reference's
# client (npm AgentClient over ws, with bench.mjs's handler per frame) takes
# to take in the replay of N retained runs when the server does no work at
# all, against the same replay from agentry-ref.
#
#   bench/sidebyside/floor.sh
#
# Builds agentry-ref and replayfloor from this checkout, starts agentry-ref
# on a fresh data folder, makes N awaited runs on one parent over HTTP,
# records that parent's connect replay (replayfloor -record), serves the
# recorded frames from replayfloor -serve (framed in advance, written in
# one piece) and then measures both servers in interleaved rounds with
# replay-floor.mjs. The "floor" figure is what no server can go below with
# these frames; the difference is the server's share. Last, replayfloor
# -measure times the same replays with a Go client, which reads far faster
# than the npm client: the server's own pace.
#
# Knobs (environment): N (1000), ROUNDS (3), REPS (10),
# WORK (${TMPDIR:-/tmp}/agentry-floor), AG_PORT (18831), FLOOR_PORT (18832).
# Needs go, node (20+), npm (the first run does `npm ci` of the reference
# harness under WORK) and curl.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CHECKOUT=$(cd "$HERE/../.." && pwd)
. "$HERE/lib.sh"
WORK=${WORK:-${TMPDIR:-/tmp}/agentry-floor}
N=${N:-1000} AG_PORT=${AG_PORT:-18831} FLOOR_PORT=${FLOOR_PORT:-18832}
export ROUNDS=${ROUNDS:-3} REPS=${REPS:-10}
mkdir -p "$WORK"
CF=$WORK/cf
cf_harness "$HERE/reference" "$CF" || { echo "floor.sh: npm ci failed" >&2; exit 1; }
cp "$HERE/replay-floor.mjs" "$CF/"
(cd "$CHECKOUT" && go build -o "$WORK/agentry-ref" ./bench/sidebyside/agentry-ref &&
  go build -o "$WORK/replayfloor" ./bench/sidebyside/replayfloor) || exit 1

pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done' EXIT
rm -rf "$WORK/data"
"$WORK/agentry-ref" -addr "127.0.0.1:$AG_PORT" -data "$WORK/data" >"$WORK/agentry.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do [ "$(curl -s -m 1 "http://127.0.0.1:$AG_PORT/ping")" = pong ] && break; sleep 0.1; done
parent=floor
seq 1 "$N" | sed "s|.*|url = \"http://127.0.0.1:$AG_PORT/agents/assistant/$parent/run-once\"\noutput = /dev/null|" >"$WORK/runs.curl"
curl -s --config "$WORK/runs.curl" || exit 1
echo "retained runs: $(curl -s "http://127.0.0.1:$AG_PORT/agents/assistant/$parent/count")"
"$WORK/replayfloor" -record "ws://127.0.0.1:$AG_PORT/agents/assistant/$parent" -out "$WORK/frames.ws" || exit 1
"$WORK/replayfloor" -serve "127.0.0.1:$FLOOR_PORT" -frames "$WORK/frames.ws" &
pids+=($!)
for _ in $(seq 1 100); do curl -s -o /dev/null "http://127.0.0.1:$FLOOR_PORT/" && break; sleep 0.1; done
echo "load $(cut -d' ' -f1-3 /proc/loadavg)"
(cd "$CF" && node replay-floor.mjs "$parent" "agentry=127.0.0.1:$AG_PORT" "floor=127.0.0.1:$FLOOR_PORT")
rc=$?
for label in agentry floor; do
  port=$AG_PORT; [ $label = floor ] && port=$FLOOR_PORT
  echo -n "$label, "
  "$WORK/replayfloor" -measure "ws://127.0.0.1:$port/agents/assistant/$parent" -frames "$WORK/frames.ws" -reps $((ROUNDS * REPS)) || rc=1
done
echo "load $(cut -d' ' -f1-3 /proc/loadavg)"
exit $rc
