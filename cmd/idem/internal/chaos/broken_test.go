//go:build linux

package chaos

// childEnv makes the test binary run as a proxy around a broken store
// instead of testing (TestMain).
const childEnv = "IDEM_CHAOS_CHILD"

func runChild() int { return 3 }
