//go:build race

package testenv

// RaceEnabled reports whether the binary was built with -race: a test
// whose point is volume may do less under the detector's cost.
const RaceEnabled = true
