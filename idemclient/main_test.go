package idemclient_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaks a goroutine, such as a
// connection whose abandoned response body was never closed.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
