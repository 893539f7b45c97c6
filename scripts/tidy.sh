#!/usr/bin/env bash
# Tidies every module of the workspace (go.work). Each module's go.mod
# requires the repository's other modules at the release version and
# replaces them by their directories (as OpenTelemetry's contrib modules
# do): a replace directive applies only in the module's own builds, never
# in a program that depends on it. `go mod tidy` ignores go.work, so each
# module first gets a replace for every other module of the workspace; the
# ones it does not require are dropped afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
mods=$(go list -m -f '{{.Path}} {{.Dir}}')
while read -r path dir; do
	adds=()
	while read -r p d; do
		[ "$p" = "$path" ] && continue
		rel=$(realpath --relative-to="$dir" "$d")
		case "$rel" in ..*) ;; *) rel=./$rel ;; esac
		adds+=("-replace=$p=$rel")
	done <<<"$mods"
	(
		cd "$dir"
		go mod edit "${adds[@]}"
		GOWORK=off GOFLAGS=-mod=mod go mod tidy
		# A module tidy adds for the first time comes at the zero
		# pseudo-version of a replaced module: require the release instead.
		sed -i 's|^\(\s*github.com/idem-dev/idem[^ ]*\) v0\.0\.0-00010101000000-000000000000|\1 v0.1.0|' go.mod
		drops=()
		while read -r p _; do
			[ "$p" = "$path" ] && continue
			grep -q "^[[:space:]]*$p v" go.mod || drops+=("-dropreplace=$p")
		done <<<"$mods"
		[ ${#drops[@]} -eq 0 ] || go mod edit "${drops[@]}"
	)
	echo "tidy: $path"
done <<<"$mods"
