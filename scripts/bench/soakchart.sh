#!/usr/bin/env bash
# soakchart.sh SERIES OUT.svg: draws the series of scripts/bench/soak.sh as
# an SVG of three panels over the minutes of the run, one line per store:
# the proxy's resident memory (MiB), the p99 latency of each minute (ms) and
# the store's records (thousands). Nothing but the recorded series goes in.
set -euo pipefail
series=$1 out=$2
awk '
BEGIN {
	W = 900; PH = 200; TOP = 60; GAP = 50; LEFT = 70; RIGHT = 150
	np = 3
	title[1] = "proxy RSS (MiB)"; title[2] = "p99 latency (ms)"; title[3] = "records in the store (thousands)"
	colour["postgres"] = "#1f77b4"; colour["redis"] = "#d62728"
}
/^# soak.sh:/ { head = substr($0, 3); next }
/^#/ || NF < 8 { next }
{
	m = $1; s = $2
	if (!(s in seen)) { seen[s] = 1; stores[++ns] = s }
	v[1, s, m] = $6 / 1024; v[2, s, m] = $5 / 1000; v[3, s, m] = $7 / 1000
	rps[s, m] = $3
	if (m > maxm) maxm = m
	for (p = 1; p <= 3; p++) if (v[p, s, m] > top[p]) top[p] = v[p, s, m]
}
function nice(x,   e, f) {
	if (x <= 0) return 1
	e = 10 ^ int(log(x) / log(10)); f = x / e
	return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * e
}
function X(m) { return LEFT + (maxm > 1 ? (m - 1) / (maxm - 1) : 0) * (W - LEFT - RIGHT) }
END {
	H = TOP + np * (PH + GAP) + 10
	printf "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H
	printf "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
	printf "<text x=\"%d\" y=\"22\" font-size=\"14\">soak: idem proxy --maintain, a new key per request, by minute</text>\n", LEFT
	gsub(/&/, "\\&amp;", head)
	printf "<text x=\"%d\" y=\"40\" fill=\"#555\">%s</text>\n", LEFT, head
	for (p = 1; p <= np; p++) {
		y0 = TOP + (p - 1) * (PH + GAP) + 20; ymax = nice(top[p] * 1.1)
		printf "<text x=\"%d\" y=\"%d\" font-weight=\"bold\">%s</text>\n", LEFT, y0 - 6, title[p]
		printf "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#999\"/>\n", LEFT, y0, W - LEFT - RIGHT, PH
		for (t = 0; t <= 4; t++) {
			yy = y0 + PH - t / 4 * PH
			printf "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n", LEFT, W - RIGHT, yy, yy
			printf "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", LEFT - 6, yy + 4, ymax * t / 4
		}
		for (m = 1; m <= maxm; m += (maxm > 10 ? 5 : 1))
			printf "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%d</text>\n", X(m), y0 + PH + 16, m
		for (i = 1; i <= ns; i++) {
			s = stores[i]; pts = ""
			for (m = 1; m <= maxm; m++) if ((p, s, m) in v)
				pts = pts sprintf("%.1f,%.1f ", X(m), y0 + PH - v[p, s, m] / ymax * PH)
			printf "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"%s\"/>\n", colour[s] ? colour[s] : "#333", pts
			if (p == 1) {
				sum = 0; k = 0
				for (m = 1; m <= maxm; m++) if ((s, m) in rps) { sum += rps[s, m]; k++ }
				printf "<text x=\"%d\" y=\"%d\" fill=\"%s\">%s, %.0f req/s</text>\n", W - RIGHT + 10, y0 + 16 * i, colour[s] ? colour[s] : "#333", s, k ? sum / k : 0
			}
		}
	}
	printf "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">minute</text>\n", (LEFT + W - RIGHT) / 2, H - 6
	print "</svg>"
}' "$series" >"$out"
