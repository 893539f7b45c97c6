package cli

import (
	"context"
	"fmt"
	"strings"

	"github.com/idem-dev/idem/idemstore"
)

// mastersLister is a store that spreads its records over several servers
// and names them (idemredis on a Redis Cluster or a Ring).
type mastersLister interface {
	Masters(ctx context.Context) ([]string, error)
}

// mastersOf returns the function that names the servers holding the
// store's records, or nil for a store that has them in one place.
func mastersOf(s idemstore.Store) func(context.Context) ([]string, error) {
	if m, ok := s.(mastersLister); ok {
		return m.Masters
	}
	return nil
}

// spanNote says which servers a command that reads or cleans every record
// visited: "every master (3: a, b, c)", or "" for a store in one place. A
// failure to name them is part of the note: the command itself went
// through the store, which reaches every master regardless.
func spanNote(ctx context.Context, s idemstore.Store) string {
	masters := mastersOf(s)
	if masters == nil {
		return ""
	}
	addrs, err := masters(ctx)
	switch {
	case err != nil:
		return fmt.Sprintf("every master (could not name them: %v)", err)
	case len(addrs) == 0:
		return ""
	}
	return fmt.Sprintf("every master (%d: %s)", len(addrs), strings.Join(addrs, ", "))
}
