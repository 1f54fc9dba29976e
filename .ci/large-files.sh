#!/bin/sh
# large-files.sh fails if a file tracked by git is larger than the limit,
# except the embedded web bundle under web/dist. It reads the index, so a
# file staged but not yet committed counts too. The repository holds
# sources only: a build output committed by mistake (a 75 MB binary once)
# makes every clone carry it.
#
# Run it alone from anywhere in the repository, or through `make lint`.
#
# Usage: .ci/large-files.sh [limit-in-bytes]   (default 2 MiB)
set -eu

limit=${1:-2097152}
cd "$(git rev-parse --show-toplevel)"

# git ls-files -s prints "mode object stage<TAB>path"; cat-file turns each
# "object path" into "size path". Submodules (mode 160000) have no blob.
big=$(git ls-files -s |
	awk -F '\t' '{ split($1, a, " "); if (a[1] != "160000") print a[2] " " $2 }' |
	git cat-file --batch-check='%(objectsize) %(rest)' |
	awk -v limit="$limit" '$1 > limit && $2 !~ /^web\/dist\// { print }')

if [ -n "$big" ]; then
	echo "large-files: tracked files over $limit bytes (only web/dist may be):" >&2
	echo "$big" >&2
	exit 1
fi
