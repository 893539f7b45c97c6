package idempgx

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-dev/idem/internal/testenv"
)

// TestReservePlanUsesPrimaryKey pins down that the reserve and reclaim
// statements find their record by the primary key in a generic plan made on
// an empty table,
// which is what a pool's connections prepare when a store starts fresh: a
// branch that could use idem_keys_reap_idx (live completed records by
// expires_at) or a sequential scan instead reads every record on every
// reservation once the table has grown.
func TestReservePlanUsesPrimaryKey(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	// A connection of its own: the setting and the prepared statement must
	// not reach the shared pool, whose connections pgx prepares statements on.
	conn, err := pgx.Connect(ctx, testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan"); err != nil {
		t.Fatal(err)
	}
	for _, st := range []struct{ name, sql string }{{"reserve", s.q.reserve}, {"reclaim", s.q.reclaim}} {
		t.Run(st.name, func(t *testing.T) {
			checkPlanUsesPrimaryKey(ctx, t, conn, st.name, st.sql)
		})
	}
}

// checkPlanUsesPrimaryKey prepares sql, one of the reserve statements, on
// conn and checks that every scan of idem_keys in its plan is by the
// primary key.
func checkPlanUsesPrimaryKey(ctx context.Context, t *testing.T, conn *pgx.Conn, name, sql string) {
	if _, err := conn.Exec(ctx, "PREPARE idem_"+name+"_plan AS "+sql); err != nil {
		t.Fatalf("preparing %s: %v", name, err)
	}
	rows, err := conn.Query(ctx, `EXPLAIN EXECUTE idem_`+name+`_plan('', 'POST /v1/payments', 'key-1', 'fp',
		'token', now(), now(), now(), 'unknown', interval '1 day')`)
	if err != nil {
		t.Fatal(err)
	}
	var plan []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, line)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	scans := 0
	for _, line := range plan {
		if !strings.Contains(line, "Scan") || !strings.Contains(line, " on idem_keys ") {
			continue
		}
		scans++
		if !strings.Contains(line, "Index Scan using idem_keys_pkey on idem_keys ") {
			t.Errorf("%s reads idem_keys other than by its primary key: %s", name, strings.TrimSpace(line))
		}
	}
	if scans == 0 {
		t.Errorf("no scan of idem_keys in the plan:\n%s", strings.Join(plan, "\n"))
	}
	if t.Failed() {
		t.Logf("plan:\n%s", strings.Join(plan, "\n"))
	}
}
