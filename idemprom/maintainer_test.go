package idemprom_test

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idem-dev/idem/idemprom"
)

func TestMaintainerCollector(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	var calls atomic.Int64
	stats := idemprom.MaintainerStats{
		UnknownBacklog:          7,
		UnknownBacklogTruncated: true,
		Unresolved:              2,
		OldestInProgress:        1500 * time.Millisecond,
		Outbox:                  true,
		OutboxDepth:             12,
		DeadLetters:             3,
		Swept:                   4,
		Reaped:                  100,
		ResolvedCompleted:       5,
		ResolvedReleased:        1,
		ReconcileErrors:         6,
		PassErrors:              8,
		OldestUnknown:           90 * time.Second,
		ReconcileScheduled:      9,
		ReconcileLeft:           11,
	}
	if err := idemprom.RegisterMaintainer(reg, func() idemprom.MaintainerStats {
		calls.Add(1)
		return stats
	}); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP idem_oldest_in_progress_seconds Age of the oldest in-progress idempotency record with a live lease; 0 when there is none.
# TYPE idem_oldest_in_progress_seconds gauge
idem_oldest_in_progress_seconds 1.5
# HELP idem_outbox_dead_letters Outbox messages dead-lettered after their last attempt.
# TYPE idem_outbox_dead_letters gauge
idem_outbox_dead_letters 3
# HELP idem_outbox_depth Outbox messages waiting for delivery.
# TYPE idem_outbox_depth gauge
idem_outbox_depth 12
# HELP idem_unknown_backlog Unknown idempotency records awaiting reconciliation, counted in the store.
# TYPE idem_unknown_backlog gauge
idem_unknown_backlog 7
# HELP idem_unknown_backlog_truncated 1 when the unknown backlog count stopped at the scan limit, so the backlog is at least idem_unknown_backlog.
# TYPE idem_unknown_backlog_truncated gauge
idem_unknown_backlog_truncated 1
# HELP idem_unknown_oldest_age_seconds Age of the oldest unknown idempotency record since it turned unknown; 0 when there is none.
# TYPE idem_unknown_oldest_age_seconds gauge
idem_unknown_oldest_age_seconds 90
# HELP idem_reconcile_scheduled_total Reconciliation attempts that left a record unknown and scheduled its next attempt after a backoff.
# TYPE idem_reconcile_scheduled_total counter
idem_reconcile_scheduled_total 9
# HELP idem_reconcile_left Due unknown idempotency records the last reconciliation pass had no time to ask about, left for the next pass.
# TYPE idem_reconcile_left gauge
idem_reconcile_left 11
# HELP idem_unknown_unresolved Unknown idempotency records the reconciler tried and could not resolve yet.
# TYPE idem_unknown_unresolved gauge
idem_unknown_unresolved 2
# HELP idem_maint_resolved_total Unknown idempotency records the reconciler settled, by the state they were settled to.
# TYPE idem_maint_resolved_total counter
idem_maint_resolved_total{state="completed"} 5
idem_maint_resolved_total{state="released"} 1
# HELP idem_maint_swept_total Expired leases the sweeper settled.
# TYPE idem_maint_swept_total counter
idem_maint_swept_total 4
# HELP idem_maint_reaped_total Idempotency records the reaper deleted past their retention.
# TYPE idem_maint_reaped_total counter
idem_maint_reaped_total 100
# HELP idem_maint_reconcile_errors_total Reconciliation calls that failed, panicked or returned an invalid resolution.
# TYPE idem_maint_reconcile_errors_total counter
idem_maint_reconcile_errors_total 6
# HELP idem_maint_pass_errors_total Maintenance passes that ended with an error.
# TYPE idem_maint_pass_errors_total counter
idem_maint_pass_errors_total 8
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 1 {
		t.Errorf("stats called %d times for one scrape, want 1", calls.Load())
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}

	// The values are read on every scrape.
	stats.UnknownBacklog = 0
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP idem_unknown_backlog Unknown idempotency records awaiting reconciliation, counted in the store.
# TYPE idem_unknown_backlog gauge
idem_unknown_backlog 0
`), "idem_unknown_backlog"); err != nil {
		t.Fatal(err)
	}
}

func TestMaintainerCollectorWithoutOutbox(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(idemprom.NewMaintainerCollector(func() idemprom.MaintainerStats {
		return idemprom.MaintainerStats{UnknownBacklog: 1}
	}))
	if n := testutil.CollectAndCount(reg, "idem_outbox_depth", "idem_outbox_dead_letters"); n != 0 {
		t.Fatalf("outbox gauges exported without an outbox: %d series", n)
	}
	if n := testutil.CollectAndCount(reg, "idem_unknown_backlog"); n != 1 {
		t.Fatalf("idem_unknown_backlog has %d series, want 1", n)
	}
}
