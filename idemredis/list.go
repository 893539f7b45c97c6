package idemredis

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemstore"
)

// listFields are the fields KeyList reads to filter, before it reads the
// full records of the page.
var listFields = []string{
	"scope", "endpoint", "key", "state", "locked_until",
	"lease_expired_state", "created_at", "expires_at",
}

// scanCount is the COUNT hint of KeyList's SCAN.
const scanCount = 1000

// KeyList returns records ordered by (Scope, Endpoint, Key), as of the
// store's clock (records past ExpiresAt are left out, expired leases are
// reported in the state they turn into).
//
// Cost: it SCANs every master for the store's prefix and reads the filter
// fields of every record found (HMGET, pipelined per SCAN batch), keeping
// only the best Limit candidates in memory, then reads the page's records.
// Every page costs a pass over all records under the prefix: an admin path,
// not a request path.
//
// A candidate that changes between the filter pass and the read (another
// process resolved it) is dropped; the page is then filled from a further
// pass after the last candidate, so a short page always means the end of
// the list, as the callers that paginate assume.
func (s *Store) KeyList(ctx context.Context, p *idemstore.ListParams) ([]*idemstore.Record, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = defaultListLimit
	}
	now := s.now()
	var out []*idemstore.Record
	q := *p
	for {
		q.Limit = limit - len(out)
		page, last, candidates, err := s.listOnce(ctx, &q, now)
		if err != nil {
			return nil, err
		}
		out = append(out, page...)
		if len(out) >= limit || candidates < q.Limit {
			return out, nil
		}
		q.After = &last
	}
}

// listOnce is one filter pass and read of KeyList. It returns the records
// that still match, the identity of the last candidate and the number of
// candidates, which is below p.Limit only when the list has no more.
func (s *Store) listOnce(ctx context.Context, p *idemstore.ListParams, now time.Time) ([]*idemstore.Record, idemstore.Identity, int, error) {
	limit := p.Limit
	pattern := escapeGlob(s.prefix) + "{*}:r:*"

	var (
		mu    sync.Mutex
		cands []listCandidate
	)
	trim := func() {
		slices.SortFunc(cands, func(a, b listCandidate) int { return compareIdentity(a.id, b.id) })
		if len(cands) > limit {
			cands = cands[:limit]
		}
	}
	err := s.forEachNode(ctx, func(ctx context.Context, node redis.Cmdable) error {
		var cursor uint64
		for {
			keys, next, err := node.Scan(ctx, cursor, pattern, scanCount).Result()
			if err != nil {
				return fmt.Errorf("scanning keys: %w", err)
			}
			if len(keys) > 0 {
				found, err := s.filterKeys(ctx, keys, p, now)
				if err != nil {
					return err
				}
				mu.Lock()
				cands = append(cands, found...)
				if len(cands) > 2*limit {
					trim()
				}
				mu.Unlock()
			}
			if cursor = next; cursor == 0 {
				return nil
			}
		}
	})
	if err != nil {
		return nil, idemstore.Identity{}, 0, fmt.Errorf("listing keys: %w", interpretError(err))
	}
	trim()
	var last idemstore.Identity
	if len(cands) > 0 {
		last = cands[len(cands)-1].id
	}

	pipe := s.client.Pipeline()
	cmds := make([]*redis.MapStringStringCmd, len(cands))
	for i, c := range cands {
		cmds[i] = pipe.HGetAll(ctx, c.key)
	}
	if len(cmds) > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, last, 0, fmt.Errorf("listing keys: %w", interpretError(err))
		}
	}
	out := make([]*idemstore.Record, 0, len(cmds))
	for _, cmd := range cmds {
		m := cmd.Val()
		if len(m) == 0 {
			continue // removed since the filter pass
		}
		r, err := recordFromMap(m)
		if err != nil {
			return nil, last, 0, fmt.Errorf("listing keys: %w", err)
		}
		if expired(r, now) {
			continue
		}
		if r.LeaseExpired(now) {
			r.State = r.LeaseExpiredState
		}
		if p.State != "" && r.State != p.State {
			continue // changed since the filter pass
		}
		out = append(out, r)
	}
	return out, last, len(cands), nil
}

type listCandidate struct {
	id  idemstore.Identity
	key string
}

// filterKeys reads the filter fields of keys and returns those that match p.
func (s *Store) filterKeys(ctx context.Context, keys []string, p *idemstore.ListParams, now time.Time) ([]listCandidate, error) {
	pipe := s.client.Pipeline()
	cmds := make([]*redis.SliceCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.HMGet(ctx, k, listFields...)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("reading records: %w", err)
	}
	var out []listCandidate
	for i, cmd := range cmds {
		f := make(map[string]string, len(listFields))
		for j, v := range cmd.Val() {
			if s, ok := v.(string); ok {
				f[listFields[j]] = s
			}
		}
		if f["state"] == "" {
			continue // removed since SCAN
		}
		id := idemstore.Identity{Scope: f["scope"], Endpoint: f["endpoint"], Key: f["key"]}
		expiresAt, err1 := parseMicros(f["expires_at"])
		createdAt, err2 := parseMicros(f["created_at"])
		lockedUntil, err3 := parseMicros(f["locked_until"])
		if err1 != nil || err2 != nil || err3 != nil {
			return nil, fmt.Errorf("decoding record %s: bad times", keys[i])
		}
		state := idemstore.State(f["state"])
		if state == idemstore.StateInProgress && !now.Before(lockedUntil) {
			state = idemstore.State(f["lease_expired_state"])
		}
		switch {
		case now.After(expiresAt) && state != idemstore.StateUnknown,
			p.State != "" && state != p.State,
			p.Scope != "" && id.Scope != p.Scope,
			p.Endpoint != "" && id.Endpoint != p.Endpoint,
			!p.CreatedBefore.IsZero() && !createdAt.Before(p.CreatedBefore),
			p.After != nil && compareIdentity(id, *p.After) <= 0:
			continue
		}
		out = append(out, listCandidate{id: id, key: keys[i]})
	}
	return out, nil
}

// forEachNode calls fn with every master of a cluster or shard of a ring
// (concurrently), or with the client itself.
func (s *Store) forEachNode(ctx context.Context, fn func(ctx context.Context, node redis.Cmdable) error) error {
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			return fn(ctx, node)
		})
	case *redis.Ring:
		return c.ForEachShard(ctx, func(ctx context.Context, node *redis.Client) error {
			return fn(ctx, node)
		})
	}
	return fn(ctx, s.client)
}

func compareIdentity(a, b idemstore.Identity) int {
	return cmp.Or(
		cmp.Compare(a.Scope, b.Scope),
		cmp.Compare(a.Endpoint, b.Endpoint),
		cmp.Compare(a.Key, b.Key),
	)
}

// Masters returns the addresses of the servers that hold the store's
// records when there are several: every master of a Redis Cluster (as
// ForEachMaster finds them) or every shard of a Ring, sorted. KeyList scans
// each of them; KeySweep and KeyReap reach each through the lease and
// expiry indexes of the buckets, which are spread over all of them. It
// returns nil for a single server (or the master Sentinels name).
func (s *Store) Masters(ctx context.Context) ([]string, error) {
	var (
		mu    sync.Mutex
		addrs []string
	)
	add := func(_ context.Context, node *redis.Client) error {
		mu.Lock()
		addrs = append(addrs, node.Options().Addr)
		mu.Unlock()
		return nil
	}
	var err error
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, add)
	case *redis.Ring:
		err = c.ForEachShard(ctx, add)
	default:
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing masters: %w", err)
	}
	slices.Sort(addrs)
	return addrs, nil
}
