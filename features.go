//go:build !idembench

package idem

// The per-request features a benchmark build can turn off one at a time,
// to measure what each costs (BENCHMARKS.md, "What each feature costs";
// scripts/bench/features.sh). In every build but `-tags idembench` they are
// constants and the compiler drops the branches on them, so they cost
// nothing. See features_idembench.go for their meaning.
const (
	offCanonical = false
	offHeartbeat = false
	offMetrics   = false
	offLogging   = false
	offRecorder  = false
	offCrypt     = false
	offDeadlines = false
	offBodyRead  = false
)
