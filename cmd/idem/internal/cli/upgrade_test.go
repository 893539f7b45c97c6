package cli

import (
	"context"
	"database/sql"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-dev/idem/cmd/idem/internal/storeurl"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv"
)

// upgradeRows are the records written in the schema before the
// reconciliation state: a completed record within retention, an unknown one
// past its expires_at, an in_progress one whose lease expired into unknown
// past its expires_at. Times are relative to now; created 2 h ago with a 1 h
// retention unless said otherwise.
var upgradeRows = []struct {
	key, state string
	expiresIn  time.Duration
}{
	{"k-completed", "completed", time.Hour},
	{"k-unknown", "unknown", -time.Hour},
	{"k-lapsed", "in_progress", -time.Hour},
}

// testUpgrade runs `idem migrate up` from the previous schema with rows in
// it (insert writes them with the old columns), then checks that the rows
// read back with the reconciliation state and a retention derived from the
// old one, that unknown records past their retention are kept, claimed and
// settled with a restarted retention.
func testUpgrade(t *testing.T, store, latest string, insert func(key, state string, created, expires time.Time)) {
	t.Helper()
	mustRun(t, "migrate", "up", "--store", store)
	// Revert latest and the migrations after it, newest first: up applies
	// them again, oldest first.
	var want string
	for done := false; !done; {
		out := mustRun(t, "migrate", "down", "--store", store)
		name, ok := strings.CutPrefix(out, "reverted ")
		if !ok {
			t.Fatalf("down printed %q before it reverted %s", out, latest)
		}
		want = "applied " + name + want
		done = name == latest+"\n"
	}
	now := time.Now().UTC().Truncate(time.Second)
	for _, r := range upgradeRows {
		insert(r.key, r.state, now.Add(-2*time.Hour), now.Add(r.expiresIn))
	}
	if out := mustRun(t, "migrate", "up", "--store", store); out != want {
		t.Fatalf("up printed %q, want %q", out, want)
	}

	ctx := t.Context()
	s, closeStore, err := storeurl.Open(ctx, store)
	if err != nil {
		t.Fatal(err)
	}
	defer closeStore()
	id := func(key string) idemstore.Identity {
		return idemstore.Identity{Scope: "acme", Endpoint: payments, Key: key}
	}
	for _, r := range upgradeRows {
		rec, err := s.KeyGet(ctx, id(r.key))
		if err != nil {
			t.Fatalf("KeyGet(%s) after the upgrade: %v", r.key, err)
		}
		want := idemstore.State(r.state)
		if r.state == "in_progress" {
			want = idemstore.StateUnknown
		}
		if rec.State != want || rec.TTL != r.expiresIn+2*time.Hour || rec.ReconcileAttempts != 0 || rec.ReconcileError != "" || !rec.ReconcileAfter.IsZero() {
			t.Fatalf("%s after the upgrade: %s, TTL %v, reconcile %v %d %q", r.key, rec.State, rec.TTL, rec.ReconcileAfter, rec.ReconcileAttempts, rec.ReconcileError)
		}
	}
	if n, err := s.KeyReap(ctx, &idemstore.ReapParams{}); err != nil || n != 0 {
		t.Fatalf("KeyReap after the upgrade = %d, %v; want nothing (no settled record is past its retention)", n, err)
	}
	if _, err := s.KeySweep(ctx, &idemstore.SweepParams{}); err != nil {
		t.Fatal(err)
	}
	claimed, err := s.KeyReconcileClaim(ctx, &idemstore.ReconcileClaimParams{Hold: time.Minute})
	if err != nil || len(claimed) != 2 {
		t.Fatalf("KeyReconcileClaim after the upgrade = %d records, %v; want the 2 unknown ones", len(claimed), err)
	}
	if err := s.KeyReconcileFail(ctx, &idemstore.ReconcileFailParams{Identity: id("k-unknown"), Token: "tok-k-unknown", Error: "asked too early", Delay: time.Minute}); err != nil {
		t.Fatalf("KeyReconcileFail: %v", err)
	}
	out := mustRun(t, "keys", "show", "--store", store, "--tenant", "acme", "--endpoint", payments, "k-unknown")
	for _, want := range []string{"never while unknown (retention 1h0m0s restarts", "reconcile attempts:  1\n", "reconcile error:     asked too early\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("keys show after the upgrade lacks %q:\n%s", want, out)
		}
	}
	if err := s.KeyResolve(ctx, &idemstore.ResolveParams{Identity: id("k-unknown"), Token: "tok-k-unknown", To: idemstore.StateReleased}); err != nil {
		t.Fatalf("KeyResolve: %v", err)
	}
	rec, err := s.KeyGet(ctx, id("k-unknown"))
	if err != nil || rec.State != idemstore.StateReleased || rec.ExpiresAt.Before(now.Add(time.Hour)) {
		t.Fatalf("after resolving: %+v, %v; want released, retention restarted for an hour", rec, err)
	}
}

func TestMigrateUpgradeSQLite(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "idem.db")
	testUpgrade(t, "sqlite:"+path, "002_reconcile_state", func(key, state string, created, expires time.Time) {
		db, err := sql.Open("sqlite", path)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		var status, nr any = nil, 0
		if state == "completed" {
			status = 201
		}
		us := func(t time.Time) int64 { return t.UnixMicro() }
		_, err = db.Exec(`INSERT INTO idem_keys (scope, endpoint, key, fingerprint, state, token, locked_until,
			started_at, lease_expired_state, response_status, not_replayable, created_at, updated_at, expires_at)
			VALUES ('acme', ?, ?, 'fp', ?, ?, ?, ?, 'unknown', ?, ?, ?, ?, ?)`,
			payments, key, state, "tok-"+key, us(created.Add(time.Minute)), us(created), status, nr, us(created), us(created), us(expires))
		if err != nil {
			t.Fatalf("inserting %s in the old schema: %v", key, err)
		}
	})
}

func TestMigrateUpgradePostgres(t *testing.T) {
	t.Parallel()
	store := postgresURL(t)
	u, err := url.Parse(store)
	if err != nil {
		t.Fatal(err)
	}
	schema := pgx.Identifier{u.Query().Get("schema")}.Sanitize()
	testUpgrade(t, store, "003_reconcile_state", func(key, state string, created, expires time.Time) {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, testenv.PostgresURL(t))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var status *int
		if state == "completed" {
			s := 201
			status = &s
		}
		_, err = conn.Exec(ctx, `INSERT INTO `+schema+`.idem_keys (scope, endpoint, key, fingerprint, state, token,
			locked_until, started_at, lease_expired_state, response_status, created_at, updated_at, expires_at)
			VALUES ('acme', $1, $2, 'fp', $3, $4, $5, $6, 'unknown', $7, $6, $6, $8)`,
			payments, key, state, "tok-"+key, created.Add(time.Minute), created, status, expires)
		if err != nil {
			t.Fatalf("inserting %s in the old schema: %v", key, err)
		}
	})
}
