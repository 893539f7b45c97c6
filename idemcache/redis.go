package idemcache

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemstore"
)

// DefaultRedisPrefix is the key prefix of NewRedis when given "".
const DefaultRedisPrefix = "idemcache:"

// Redis is a Cache on Redis, shared by every app node that uses the same
// Redis and prefix. Each record is one string key,
//
//	<prefix><sha256>
//
// where sha256 is the hex SHA-256 of the length-prefixed scope, endpoint and
// key. Every command touches that single key, so it works on a single node,
// Sentinel and Redis Cluster alike. The value is the record in a compact
// binary form (identity included and checked on read), written with one SET
// … PXAT at the record's ExpiresAt, so Redis removes it when it expires. It
// is safe for concurrent use.
type Redis struct {
	client redis.UniversalClient
	prefix string
}

var _ Cache = (*Redis)(nil)

// NewRedis returns a Cache on client under prefix (DefaultRedisPrefix when
// ""). Give every store (database, schema) its own prefix: records of two
// stores under one prefix would answer each other's replays. The cache does
// not close the client.
func NewRedis(client redis.UniversalClient, prefix string) *Redis {
	if prefix == "" {
		prefix = DefaultRedisPrefix
	}
	return &Redis{client: client, prefix: prefix}
}

// key returns the Redis key of id.
func (c *Redis) key(id idemstore.Identity) string {
	return c.prefix + id.Hash()
}

// Get returns the cached record of id, or nil. An entry that does not decode
// is an error (Store then asks the store); an entry of another identity is
// a miss.
func (c *Redis) Get(ctx context.Context, id idemstore.Identity) (*idemstore.Record, error) {
	data, err := c.client.Get(ctx, c.key(id)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("getting cached record: %w", err)
	}
	rec, err := decodeRecord(data)
	if err != nil {
		return nil, fmt.Errorf("getting cached record: %w", err)
	}
	if rec.Identity != id {
		return nil, nil
	}
	return rec, nil
}

// Set caches rec until its ExpiresAt, by Redis's clock. A record whose
// ExpiresAt Redis considers past is removed at once.
func (c *Redis) Set(ctx context.Context, rec *idemstore.Record) error {
	if rec.ExpiresAt.UnixMilli() <= 0 {
		return errors.New("setting cached record: no expiry")
	}
	// PXAT at ExpiresAt's millisecond, never later than ExpiresAt. Sent as
	// it is: go-redis's SetArgs.ExpireAt sends whole seconds (EXAT) before
	// v9.23.
	err := c.client.Do(ctx, "SET", c.key(rec.Identity), encodeRecord(nil, rec), "PXAT", rec.ExpiresAt.UnixMilli()).Err()
	if err != nil {
		return fmt.Errorf("setting cached record: %w", err)
	}
	return nil
}

// Delete removes the cached record of id.
func (c *Redis) Delete(ctx context.Context, id idemstore.Identity) error {
	if err := c.client.Del(ctx, c.key(id)).Err(); err != nil {
		return fmt.Errorf("deleting cached record: %w", err)
	}
	return nil
}
