package idempgx

import (
	"testing"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemtest"
)

func TestStore(t *testing.T) {
	t.Parallel()
	idemtest.RunStoreTests(t, func(t *testing.T, clock *idemtest.Clock) idemstore.Store {
		return newTestStore(t, clock.Now)
	})
}

// TestStorePartitioned runs the conformance suite on a key table
// hash-partitioned by scope into four partitions.
func TestStorePartitioned(t *testing.T) {
	t.Parallel()
	idemtest.RunStoreTests(t, func(t *testing.T, clock *idemtest.Clock) idemstore.Store {
		return newPartitionedStore(t, clock.Now, 4)
	})
}

// TestStoreGroupCommit runs the conformance suite with the statements of
// concurrent calls grouped (and their reservations merged).
func TestStoreGroupCommit(t *testing.T) {
	t.Parallel()
	idemtest.RunStoreTests(t, func(t *testing.T, clock *idemtest.Clock) idemstore.Store {
		s := newTestStore(t, clock.Now)
		s.group = s.newGroup()
		s.group.flights = 1
		return s
	})
}

// TestStorePartitionedGroupCommit runs the conformance suite grouped on a
// partitioned key table.
func TestStorePartitionedGroupCommit(t *testing.T) {
	t.Parallel()
	idemtest.RunStoreTests(t, func(t *testing.T, clock *idemtest.Clock) idemstore.Store {
		s := newPartitionedStore(t, clock.Now, 4)
		s.group = s.newGroup()
		s.group.flights = 1
		return s
	})
}
