//go:build idembench

package idem

import (
	"os"
	"slices"
	"strings"
)

// A benchmark build (-tags idembench) turns off the features named in
// IDEM_BENCH_OFF, a comma-separated list, when the process starts. Turning
// one off gives up the guarantee it buys; such a build is for measuring
// only, never for serving.
var (
	// canonical: JSON bodies are fingerprinted by their raw bytes, without
	// RFC 8785 canonicalisation (a retry with the same members in another
	// order or spacing would be refused as a reused key).
	offCanonical = benchOff("canonical")
	// heartbeat: no lease renewal, and so no alarm, while the handler
	// runs (a handler slower than the lease loses it).
	offHeartbeat = benchOff("heartbeat")
	// metrics: Config.Metrics is ignored, and store calls are not timed.
	offMetrics = benchOff("metrics")
	// logging: Config.Logger is replaced by one that discards.
	offLogging = benchOff("logging")
	// recorder: the handler's answer goes straight to the client, and
	// the record completes with its status and stored headers but no body
	// (a replay answers with an empty body).
	offRecorder = benchOff("recorder")
	// crypt: without a Keyring, the store is not wrapped by idemcrypt
	// (which otherwise refuses sealed records it cannot open).
	offCrypt = benchOff("crypt")
	// deadlines: store calls run without Config.StoreTimeout (a store
	// that hangs holds the request).
	offDeadlines = benchOff("deadlines")
	// bodytimeout: the body is read without Config.BodyTimeout's read
	// deadline on the connection (a client that trickles its body holds
	// the request).
	offBodyRead = benchOff("bodytimeout")
)

func benchOff(feature string) bool {
	return slices.Contains(strings.Split(os.Getenv("IDEM_BENCH_OFF"), ","), feature)
}
