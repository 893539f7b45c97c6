package idemsqlite

import (
	"fmt"
	"strings"
	"time"
)

// Config configures a Store. A nil *Config means all defaults.
type Config struct {
	// Now is the store's clock. Defaults to time.Now.
	Now func() time.Time
	// Synchronous is SQLite's synchronous setting for databases made by
	// Open: "FULL" makes every commit durable against power loss, "NORMAL"
	// (in WAL mode) survives a crash of the process but may lose the last
	// commits on power loss. Defaults to "FULL".
	Synchronous string
	// BusyTimeout is how long a connection of Open waits for a lock held by
	// another connection or process before failing. Defaults to 5 seconds.
	BusyTimeout time.Duration
	// MaxReadConns bounds the read-only connections of Open, which serve
	// KeyGet, KeyList and the replay path of KeyReserve. Defaults to 4.
	MaxReadConns int
	// MaxBatch bounds how many writes (reservations, completions and the
	// other writes of a key) that arrive together share one transaction and
	// so one commit: group commit, which spares an fsync per write under
	// load. A lone write never waits for others. 1 commits every write on
	// its own. Defaults to 64.
	MaxBatch int
}

// withDefaults returns a copy of cfg with every default applied.
func (cfg *Config) withDefaults() (Config, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	switch s := strings.ToUpper(c.Synchronous); s {
	case "":
		c.Synchronous = "FULL"
	case "FULL", "NORMAL":
		c.Synchronous = s
	default:
		return c, fmt.Errorf("idemsqlite: Synchronous %q: want FULL or NORMAL", c.Synchronous)
	}
	if c.BusyTimeout <= 0 {
		c.BusyTimeout = 5 * time.Second
	}
	if c.MaxReadConns <= 0 {
		c.MaxReadConns = 4
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = 64
	}
	return c, nil
}
