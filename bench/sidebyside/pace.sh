#!/usr/bin/env bash
# The server's own pace for a connect replay, revision against revision:
# builds agentry-ref at each given revision, makes N awaited runs on one
# parent with the first build, copies that data folder for every build
# (each migrates its own copy), and then times the parent's connect
# replay from each build in interleaved rounds with a Go client
# (replayfloor -measure), which reads far faster than the npm client, so
# that the figure is the server's.
#
#   bench/sidebyside/pace.sh [REV ...]     # default: HEAD~1 HEAD
#
# Knobs (environment): N (1000), ROUNDS (3), REPS (10),
# WORK (${TMPDIR:-/tmp}/agentry-pace), AG_PORT (18841). Needs go, git and curl.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CHECKOUT=$(cd "$HERE/../.." && pwd)
WORK=${WORK:-${TMPDIR:-/tmp}/agentry-pace}
N=${N:-1000} ROUNDS=${ROUNDS:-3} REPS=${REPS:-10} AG_PORT=${AG_PORT:-18841}
[ $# -gt 0 ] || set -- HEAD~1 HEAD
rm -rf "$WORK/data-"* && mkdir -p "$WORK/bin"
(cd "$CHECKOUT" && go build -o "$WORK/replayfloor" ./bench/sidebyside/replayfloor) || exit 1
builds=()
for rev in "$@"; do
  sha=$(git -C "$CHECKOUT" rev-parse --short "$rev") || exit 2
  if [ ! -x "$WORK/bin/agentry-ref-$sha" ]; then
    src=$WORK/src-$sha
    git -C "$CHECKOUT" worktree add --detach "$src" "$sha" >/dev/null 2>&1 || { echo "pace.sh: cannot check out $rev" >&2; exit 2; }
    (cd "$src" && go build -o "$WORK/bin/agentry-ref-$sha" ./bench/sidebyside/agentry-ref)
    ok=$?
    git -C "$CHECKOUT" worktree remove --force "$src"
    [ $ok = 0 ] || exit 1
  fi
  builds+=("$sha")
done
pid=
start() { # $1 build
  "$WORK/bin/agentry-ref-$1" -addr "127.0.0.1:$AG_PORT" -data "$WORK/data-$1" >>"$WORK/server-$1.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do [ "$(curl -s -m 1 "http://127.0.0.1:$AG_PORT/ping")" = pong ] && return 0; sleep 0.1; done
  echo "pace.sh: agentry-ref $1 did not start" >&2; return 1
}
stop() { kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=; }
trap stop EXIT
first=${builds[0]}
start "$first" || exit 1
seq 1 "$N" | sed "s|.*|url = \"http://127.0.0.1:$AG_PORT/agents/assistant/pace/run-once\"\noutput = /dev/null|" >"$WORK/runs.curl"
curl -s --config "$WORK/runs.curl" || exit 1
"$WORK/replayfloor" -record "ws://127.0.0.1:$AG_PORT/agents/assistant/pace" -out "$WORK/frames.ws" || exit 1
stop
for sha in "${builds[@]:1}"; do cp -r "$WORK/data-$first" "$WORK/data-$sha"; done
for r in $(seq 1 "$ROUNDS"); do
  for sha in "${builds[@]}"; do
    start "$sha" || exit 1
    echo -n "round $r $sha (load $(cut -d' ' -f1 /proc/loadavg)): "
    "$WORK/replayfloor" -measure "ws://127.0.0.1:$AG_PORT/agents/assistant/pace" -frames "$WORK/frames.ws" -reps "$REPS"
    stop
  done
done
