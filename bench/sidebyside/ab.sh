#!/usr/bin/env bash
# Agentry against Agentry: builds agentry-ref at each given revision and
# drives the builds in interleaved rounds (A B C … A B C …, each on a fresh
# server and data folder) with the reference's unchanged bench.mjs, to tell
# whether a change moved a figure (a before/after or a bisection). The
# reference itself is not run: for ratios against it use run.sh.
#
#   bench/sidebyside/ab.sh [REV ...]     # default: HEAD~1 HEAD
#
# Prints a line per round and build (awaited run over WS and HTTP:
# client median and p95, in-server median, server CPU per run; fan-out 100
# median; load average), then each build's medians over the rounds.
#
# Knobs (environment): ROUNDS (3), SEQ (200), WARM (20), NOOP (200),
# FAN (100:3), WORK (${TMPDIR:-/tmp}/agentry-ab), AG_PORT (18821).
# Needs go, node (20+), npm (the first run does `npm ci` of the reference
# harness under WORK), curl and git.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CHECKOUT=$(cd "$HERE/../.." && pwd)
. "$HERE/lib.sh"
WORK=${WORK:-${TMPDIR:-/tmp}/agentry-ab}
ROUNDS=${ROUNDS:-3} AG_PORT=${AG_PORT:-18821}
export SEQ=${SEQ:-200} WARM=${WARM:-20} NOOP=${NOOP:-200} FAN=${FAN:-100:3} REPLAY_REPS=1
[ $# -gt 0 ] || set -- HEAD~1 HEAD
mkdir -p "$WORK/bin" "$WORK/res"

# the reference's driver with its npm packages (kept while the lock file is unchanged)
CF=$WORK/cf
cf_harness "$HERE/reference" "$CF" || { echo "ab.sh: npm ci failed" >&2; exit 1; }
cp "$HERE/reference/bench.mjs" "$CF/bench.mjs"

# one build per revision, from a detached worktree of this checkout
builds=()
for rev in "$@"; do
  sha=$(git -C "$CHECKOUT" rev-parse --short "$rev") || exit 2
  bin=$WORK/bin/agentry-ref-$sha
  if [ ! -x "$bin" ]; then
    src=$WORK/src-$sha
    git -C "$CHECKOUT" worktree add --detach "$src" "$sha" >/dev/null 2>&1 || { echo "ab.sh: cannot check out $rev" >&2; exit 2; }
    (cd "$src" && go build -o "$bin" ./bench/sidebyside/agentry-ref) || { git -C "$CHECKOUT" worktree remove --force "$src"; exit 1; }
    git -C "$CHECKOUT" worktree remove --force "$src"
  fi
  builds+=("$sha")
done

summary=$WORK/res/summary-$(date +%Y%m%d-%H%M%S).txt
for r in $(seq 1 "$ROUNDS"); do
  for sha in "${builds[@]}"; do
    data=$WORK/data-$sha; rm -rf "$data"
    setsid "$WORK/bin/agentry-ref-$sha" -addr "127.0.0.1:$AG_PORT" -data "$data" >"$WORK/res/server-$r-$sha.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 100); do [ "$(curl -s -m 1 "http://127.0.0.1:$AG_PORT/ping")" = pong ] && break; sleep 0.1; done
    l0=$(cut -d' ' -f1 /proc/loadavg)
    (cd "$CF" && TAG="ab$r$sha" OUT="$WORK/res/$r-$sha.json" node bench.mjs "127.0.0.1:$AG_PORT" "127.0.0.1:$AG_PORT" "$pid" "" "") >"$WORK/res/bench-$r-$sha.log" 2>&1
    rc=$?
    kill -TERM -- "-$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    rm -rf "$data"
    l1=$(cut -d' ' -f1 /proc/loadavg)
    [ $rc = 0 ] || { echo "ab.sh: bench.mjs failed for $sha (round $r): $(tail -3 "$WORK/res/bench-$r-$sha.log")" >&2; continue; }
    node -e '
      const [f, r, sha, l0, l1] = process.argv.slice(1), p = require(f).phases, w = p["seq-ws-rpc"], h = p["seq-http-direct"];
      console.log([r, sha, w.latencyMs.median, w.latencyMs.p95, w.serverMs.median, w.userWorkerdCpuMsPerRun,
        h.latencyMs.median, h.latencyMs.p95, p["fanout-100"]?.latencyMs.median ?? "-", l0 + "/" + l1].join("\t"));
    ' "$WORK/res/$r-$sha.json" "$r" "$sha" "$l0" "$l1" | tee -a "$summary"
  done
done
echo "round build ws-median ws-p95 ws-server-median cpu-ms/run http-median http-p95 fan100-median load(before/after)"
node -e '
  const rows = require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n").map((l) => l.split("\t"));
  const med = (xs) => { const s = xs.filter((x) => x !== "-").map(Number).sort((a, b) => a - b); return s.length ? s[Math.floor((s.length - 1) / 2)] : "-"; };
  for (const sha of [...new Set(rows.map((r) => r[1]))]) {
    const mine = rows.filter((r) => r[1] === sha), col = (i) => med(mine.map((r) => r[i]));
    console.log(`${sha}: rounds ${mine.length}, WS median ${col(2)} ms p95 ${col(3)} ms (in-server ${col(4)} ms, cpu ${col(5)} ms/run), HTTP median ${col(6)} ms p95 ${col(7)} ms, fan-out 100 ${col(8)} ms`);
  }
' "$summary"
