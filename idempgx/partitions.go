package idempgx

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// MaxPartitions bounds Config.Partitions.
const MaxPartitions = 1024

// expandPartitions fills the placeholders of the first migration: with n
// above zero, the key table is hash-partitioned by scope into n tables
// idem_keys_p0 … idem_keys_p{n-1}; otherwise it is one table.
func expandPartitions(sql, schema string, n int) string {
	by, parts := "", ""
	if n > 0 {
		by = " PARTITION BY HASH (scope)"
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, "CREATE TABLE %s.%s PARTITION OF %s.idem_keys FOR VALUES WITH (MODULUS %d, REMAINDER %d);\n",
				schema, pgx.Identifier{fmt.Sprintf("idem_keys_p%d", i)}.Sanitize(), schema, n, i)
		}
		parts = b.String()
	}
	return strings.NewReplacer("{{partition_by}}", by, "{{partitions}}", parts).Replace(sql)
}

// partitionSet is the partitions of the key table as KeyReap reads them
// once, and where the next reap starts.
type partitionSet struct {
	mu     sync.Mutex
	loaded bool
	names  []string // quoted schema.table of each partition; none for a plain table
	next   atomic.Uint32
}

// reapTargets returns the key table's partitions, read on first use.
func (s *Store) reapTargets(ctx context.Context) ([]string, error) {
	s.parts.mu.Lock()
	defer s.parts.mu.Unlock()
	if !s.parts.loaded {
		names, err := s.Partitions(ctx)
		if err != nil {
			return nil, err // read again next time: the schema may be migrated by then
		}
		s.parts.names, s.parts.loaded = names, true
	}
	return s.parts.names, nil
}

// Partitions returns the quoted names of the key table's partitions, in
// order, or none when the table is not partitioned.
func (s *Store) Partitions(ctx context.Context) ([]string, error) {
	rows, err := s.pool.Query(ctx, `
SELECT format('%I.%I', n.nspname, c.relname)
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE i.inhparent = to_regclass($1)
ORDER BY length(c.relname), c.relname`, s.schema+".idem_keys")
	if err != nil {
		return nil, fmt.Errorf("reading the key table's partitions: %w", interpretError(err))
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("reading the key table's partitions: %w", interpretError(err))
	}
	return names, nil
}

// reapPartitions is KeyReap on a partitioned key table: the reap statement
// runs on one partition at a time (a smaller index, a shorter lock list),
// from a partition that rotates between calls so that one full of expired
// records does not starve the others, until limit records are deleted or
// every partition was visited once.
func (s *Store) reapPartitions(ctx context.Context, parts []string, limit int) (int, error) {
	start := int(s.parts.next.Add(1)-1) % len(parts)
	total := 0
	now := s.now()
	for i := range parts {
		if total >= limit {
			break
		}
		part := parts[(start+i)%len(parts)]
		sql := strings.ReplaceAll(s.q.reap, s.schema+".idem_keys", part)
		tag, err := s.pool.Exec(ctx, sql, now, limit-total)
		if err != nil {
			return total, fmt.Errorf("reaping keys in %s: %w", part, interpretError(err))
		}
		total += int(tag.RowsAffected())
	}
	return total, nil
}

// keyReap deletes at most limit expired records, partition by partition
// when the key table is partitioned.
func (s *Store) keyReap(ctx context.Context, limit int) (int, error) {
	parts, err := s.reapTargets(ctx)
	if err != nil {
		return 0, err
	}
	if len(parts) > 0 {
		return s.reapPartitions(ctx, parts, limit)
	}
	tag, err := s.pool.Exec(ctx, s.q.reap, s.now(), limit)
	if err != nil {
		return 0, fmt.Errorf("reaping keys: %w", interpretError(err))
	}
	return int(tag.RowsAffected()), nil
}
