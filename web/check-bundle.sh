#!/usr/bin/env bash
# Checks that web/dist, the committed and embedded build of the playground,
# is exactly what web/'s sources build to: typecheck, rebuild into a
# temporary folder, diff. Vite's output (file names included) depends only
# on the sources, the locked packages and Node, so any difference means
# dist/ is stale: rebuild it with `cd web && npm run build` and commit it.
# Run by `make test`, after `npm ci` in web/ (`make npm`).
set -euo pipefail
cd "$(dirname "$0")"
[ -d node_modules ] || npm ci --no-audit --no-fund --loglevel=error
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
npx --no-install tsc --noEmit
npx --no-install vite build --outDir "$tmp/dist" --emptyOutDir --logLevel warn
if ! diff -r dist "$tmp/dist" >"$tmp/diff"; then
	head -c 4000 "$tmp/diff" >&2
	echo >&2
	echo "web/dist does not match web/'s sources: run 'cd web && npm run build' and commit web/dist" >&2
	exit 1
fi
echo "web/dist matches its sources"
