# Shared by run.sh, ab.sh and floor.sh (sourced, not run).

# cf_harness SRC DEST: copies the reference harness SRC (without
# node_modules, .wrangler and results) to DEST and runs `npm ci` there,
# once while package.json and package-lock.json are unchanged. The npm log
# goes to DEST.npm-ci.log; returns non-zero if npm ci failed.
cf_harness() {
  local src=$1 dest=$2 stamp
  stamp=$(cat "$src/package.json" "$src/package-lock.json" | sha256sum | cut -c1-16)
  if [ ! -f "$dest/.npm-ci-$stamp" ]; then
    rm -rf "$dest" && mkdir -p "$dest"
    (cd "$src" && tar cf - --exclude=node_modules --exclude=.wrangler --exclude=results .) | (cd "$dest" && tar xf -)
    if ! (cd "$dest" && npm ci --no-audit --no-fund) >"$dest.npm-ci.log" 2>&1; then
      cat "$dest.npm-ci.log" >&2; return 1
    fi
    touch "$dest/.npm-ci-$stamp"
  else
    (cd "$src" && tar cf - --exclude=node_modules --exclude=.wrangler --exclude=results .) | (cd "$dest" && tar xf -)
  fi
}
