#!/usr/bin/env bash
# Compares the exported API of every package of every module with the last
# release and fails on an incompatible change that CHANGELOG.md's
# Unreleased section does not name. The base is the module's release tag
# (v0.1.0 for the root module, idempgx/v0.1.0 for idempgx, …) where the
# repository has it, else the release commit that CHANGELOG.md's newest
# release section names ("commit `SHA`"), else $APIDIFF_BASE. A package that
# did not exist at the base is new: nothing to compare.
set -euo pipefail
cd "$(dirname "$0")/.."
apidiff="go run golang.org/x/exp/cmd/apidiff@v0.0.0-20261113113407-e3970619a1a4"
export GOWORK=off # each module on its own, its replace directives in force

version=$(sed -n 's/^## \[\([0-9][0-9.]*\)\].*/\1/p' CHANGELOG.md | head -n 1)
commit=$(awk -v v="## [$version]" 'index($0, v) == 1 {f = 1; next} f && /^## / {exit} f' CHANGELOG.md |
	grep -o 'commit `[0-9a-f]\{7,40\}`' | head -n 1 | tr -d '`' | cut -d' ' -f2 || true)
unreleased=$(awk '/^## \[Unreleased\]/ {f = 1; next} f && /^## / {exit} f' CHANGELOG.md)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
while read -r path dir; do
	rel=${dir#"$PWD"}
	rel=${rel#/}
	case "$rel" in internal/* | cmd/*) continue ;; esac # no API to keep
	tag=v$version
	[ -n "$rel" ] && tag=$rel/v$version
	base=${APIDIFF_BASE:-}
	if [ -z "$base" ] && [ -n "$version" ] && git rev-parse -q --verify "refs/tags/$tag" >/dev/null; then
		base=$tag
	elif [ -z "$base" ]; then
		base=$commit
	fi
	if [ -z "$base" ]; then
		echo "apidiff: no release to compare with (no tag, no release commit in CHANGELOG.md)"
		exit 0
	fi
	if ! git cat-file -e "$base:${rel:+$rel/}go.mod" 2>/dev/null; then
		echo "apidiff: $path is new since $base"
		continue
	fi
	src=$tmp/src-$(tr / _ <<<"$base")
	if [ ! -d "$src" ]; then
		mkdir -p "$src"
		git archive "$base" | tar -x -C "$src"
	fi
	report=""
	for pkg in $(cd "$src/$rel" && go list ./... | grep -v /internal/); do
		file=$tmp/$(tr / _ <<<"$pkg").export
		(cd "$src/$rel" && $apidiff -w "$file" "$pkg")
		if ! (cd "$dir" && go list "$pkg" >/dev/null 2>&1); then
			report+="- $pkg: removed"$'\n'
			continue
		fi
		report+=$(cd "$dir" && $apidiff -incompatible "$file" "$pkg" | sed -n "s|^- |- ${pkg#"$path"}|p" | sed 's|^- /|- |')$'\n'
	done
	missing="" n=0
	while read -r line; do
		[ -z "$line" ] && continue
		n=$((n + 1))
		name=$(sed -n 's/^- \([^:]*\):.*/\1/p' <<<"$line")
		grep -qF -- "${name##*.}" <<<"$unreleased" || missing+="  $line"$'\n'
	done <<<"$report"
	if [ -n "$missing" ]; then
		echo "apidiff: $path has incompatible changes since $base that CHANGELOG.md's Unreleased section does not name:"
		printf '%s' "$missing"
		status=1
	else
		echo "apidiff: $path: $n incompatible changes since $base, each named in CHANGELOG.md"
	fi
done < <(GOWORK= go list -m -f '{{.Path}} {{.Dir}}')
exit $status
