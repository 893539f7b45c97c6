package idemredis

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemstore"
)

// listFields are the fields KeyList reads to filter a record of the earlier
// layout (a hash), before it reads the full records of the page.
var listFields = []string{
	"scope", "endpoint", "key", "state", "locked_until",
	"lease_expired_state", "created_at", "expires_at",
}

// listPrefix is how many bytes of each record KeyList reads to filter
// (GETRANGE): the head and the identity of nearly every record, never the
// body of a large one. A record whose identity does not fit is read whole.
const listPrefix = 1024

// scanCount is the COUNT hint of KeyList's SCAN.
const scanCount = 1000

// KeyList returns records ordered by (Scope, Endpoint, Key), as of the
// store's clock (records past ExpiresAt are left out, expired leases are
// reported in the state they turn into).
//
// Cost: it SCANs every master for the store's prefix and reads the head
// and identity of every record found (GETRANGE of the first listPrefix
// bytes, pipelined per SCAN batch), keeping
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

	keys := make([]string, len(cands))
	for i, c := range cands {
		keys[i] = c.key
	}
	records, err := s.getRecords(ctx, keys)
	if err != nil {
		return nil, last, 0, fmt.Errorf("listing keys: %w", err)
	}
	out := make([]*idemstore.Record, 0, len(records))
	for _, r := range records {
		if r == nil {
			continue // removed since the filter pass
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

// getRecords reads the records stored at keys, pipelined: one GET each, and
// an HGETALL for a record of the earlier layout. A record that is gone is
// nil.
func (s *Store) getRecords(ctx context.Context, keys []string) ([]*idemstore.Record, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	pipe := s.client.Pipeline()
	gets := make([]*redis.StringCmd, len(keys))
	for i, k := range keys {
		gets[i] = pipe.Get(ctx, k)
	}
	_, _ = pipe.Exec(ctx) // errors are read per command
	out := make([]*idemstore.Record, len(keys))
	hashes := map[int]*redis.MapStringStringCmd{}
	pipe = s.client.Pipeline()
	for i, cmd := range gets {
		v, err := cmd.Result()
		switch {
		case errors.Is(err, redis.Nil):
		case isWrongType(err):
			hashes[i] = pipe.HGetAll(ctx, keys[i])
		case err != nil:
			return nil, interpretError(err)
		default:
			if out[i], err = decodeRecord(v); err != nil {
				return nil, err
			}
		}
	}
	if len(hashes) == 0 {
		return out, nil
	}
	_, _ = pipe.Exec(ctx)
	for i, cmd := range hashes {
		m, err := cmd.Result()
		if err != nil {
			return nil, interpretError(err)
		}
		if len(m) == 0 {
			continue
		}
		if out[i], err = recordFromMap(m); err != nil {
			return nil, err
		}
	}
	return out, nil
}

type listCandidate struct {
	id  idemstore.Identity
	key string
}

// filterKeys reads the filter fields of keys and returns those that match p.
// It reads the first listPrefix bytes of each record (GETRANGE, pipelined),
// the whole of one whose identity is longer, and the filter fields of a
// record of the earlier layout (HMGET).
func (s *Store) filterKeys(ctx context.Context, keys []string, p *idemstore.ListParams, now time.Time) ([]listCandidate, error) {
	pipe := s.client.Pipeline()
	cmds := make([]*redis.StringCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.GetRange(ctx, k, 0, listPrefix-1)
	}
	_, _ = pipe.Exec(ctx) // errors are read per command
	fields := make([]recordFields, len(keys))
	var (
		again  = s.client.Pipeline()
		whole  = map[int]*redis.StringCmd{}
		hashes = map[int]*redis.SliceCmd{}
	)
	for i, cmd := range cmds {
		v, err := cmd.Result()
		switch {
		case isWrongType(err):
			hashes[i] = again.HMGet(ctx, keys[i], listFields...)
			continue
		case err != nil:
			return nil, fmt.Errorf("reading records: %w", interpretError(err))
		case v == "":
			continue // removed since SCAN
		}
		switch err := fields[i].parsePrefix(v); {
		case err == errShort:
			whole[i] = again.Get(ctx, keys[i])
		case err != nil:
			return nil, fmt.Errorf("decoding record %s: %w", keys[i], err)
		}
	}
	if len(whole)+len(hashes) > 0 {
		_, _ = again.Exec(ctx)
		for i, cmd := range whole {
			v, err := cmd.Result()
			switch {
			case errors.Is(err, redis.Nil):
			case err != nil:
				return nil, fmt.Errorf("reading records: %w", interpretError(err))
			default:
				if err := fields[i].parse(v); err != nil {
					return nil, fmt.Errorf("decoding record %s: %w", keys[i], err)
				}
			}
		}
		for i, cmd := range hashes {
			vals, err := cmd.Result()
			if err != nil {
				return nil, fmt.Errorf("reading records: %w", interpretError(err))
			}
			for j, v := range vals {
				if s, ok := v.(string); ok {
					fields[i].set(listFields[j], s)
				}
			}
		}
	}
	var out []listCandidate
	for i := range fields {
		f := &fields[i]
		if f.state == "" {
			continue // removed since SCAN
		}
		id := idemstore.Identity{Scope: f.scope, Endpoint: f.endpoint, Key: f.key}
		expiresAt, err1 := parseMicros(f.expiresAt)
		createdAt, err2 := parseMicros(f.createdAt)
		lockedUntil, err3 := parseMicros(f.lockedUntil)
		if err1 != nil || err2 != nil || err3 != nil {
			return nil, fmt.Errorf("decoding record %s: bad times", keys[i])
		}
		state := idemstore.State(f.state)
		if state == idemstore.StateInProgress && !now.Before(lockedUntil) {
			state = idemstore.State(f.leaseExpiredState)
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
		// The identity is a slice of the prefix read: copied, so that the
		// candidates kept do not hold every prefix.
		id = idemstore.Identity{Scope: strings.Clone(id.Scope), Endpoint: strings.Clone(id.Endpoint), Key: strings.Clone(id.Key)}
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
