package idemcache

import (
	"context"

	"github.com/idem-dev/idem/idemstore"
)

// Cache holds completed records by identity. NewLRU and NewRedis are the two
// implementations; any other must be safe for concurrent use.
//
// A Cache is only an optimisation: Store treats every error as a miss and
// asks the store. An implementation should honour its context's deadline.
type Cache interface {
	// Get returns the cached record of id, or nil and no error when there is
	// none. The returned record is the caller's: it must not share headers or
	// body with the cache.
	Get(ctx context.Context, id idemstore.Identity) (*idemstore.Record, error)
	// Set stores rec under rec.Identity until rec.ExpiresAt (Redis removes
	// it then; the LRU keeps it until it is evicted or replaced, and Store
	// never serves it past ExpiresAt). Set must not modify rec or keep
	// references into it after it returns.
	Set(ctx context.Context, rec *idemstore.Record) error
	// Delete removes the record of id, if any.
	Delete(ctx context.Context, id idemstore.Identity) error
}
