package idemmysql

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
