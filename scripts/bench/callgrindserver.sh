# callgrindserver.sh, sourced by pginstructions.sh (MODE=server) and
# pgmultirow.sh, whose PostgreSQL runs under callgrind with one output file
# per backend in a directory.
#
# newest_backend DIR BEFORE: waits (up to 300 s) for the file of the backend
# that served the last run, the largest count among DIR's files not listed in
# BEFORE (the output of ls DIR taken before the run), and prints its name.
newest_backend() {
	local f
	for _ in $(seq 300); do
		f=$(comm -13 <(echo "$2") <(ls "$1") | while read -r g; do
			awk -v g="$g" '/^(summary|totals):/ { print $2, g; exit }' "$1/$g"
		done | sort -n | tail -1 | cut -d ' ' -f 2)
		[ -z "$f" ] || break
		sleep 1
	done
	echo "$f"
}
