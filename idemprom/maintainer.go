package idemprom

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// MaintainerStats are the values the maintainer collector exports. They
// mirror the maintainer's and the outbox's statistics without depending on
// those packages; the command that runs them fills this struct.
type MaintainerStats struct {
	// UnknownBacklog is the number of unknown records awaiting
	// reconciliation (idem_unknown_backlog), counted in the store so that
	// every node reports the same.
	UnknownBacklog int
	// OldestUnknown is the age of the oldest unknown record, since it turned
	// unknown (idem_unknown_oldest_age_seconds); zero when there is none.
	OldestUnknown time.Duration
	// UnknownBacklogTruncated reports that the count stopped at a scan
	// limit: the backlog is at least UnknownBacklog
	// (idem_unknown_backlog_truncated, 0 or 1).
	UnknownBacklogTruncated bool
	// Unresolved is the number of unknown records the reconciler tried and
	// could not resolve yet (idem_unknown_unresolved).
	Unresolved int
	// ReconcileLeft is the number of due unknown records the last
	// reconciliation pass had no time to ask about and left for the next
	// pass (idem_reconcile_left): above zero pass after pass, the
	// reconciler needs more concurrency.
	ReconcileLeft int
	// OldestInProgress is the age of the oldest in_progress record with a
	// live lease (idem_oldest_in_progress_seconds); zero when there is none.
	OldestInProgress time.Duration

	// Outbox reports that OutboxDepth and DeadLetters were measured; without
	// it their gauges are not exported at all (no outbox, or it could not be
	// read), rather than exported as a misleading zero.
	Outbox bool
	// OutboxDepth is the number of outbox messages waiting for delivery
	// (idem_outbox_depth).
	OutboxDepth int
	// DeadLetters is the number of dead-lettered outbox messages
	// (idem_outbox_dead_letters).
	DeadLetters int

	// Swept counts the expired leases the sweeper settled
	// (idem_maint_swept_total).
	Swept int64
	// Reaped counts the records the reaper deleted (idem_maint_reaped_total).
	Reaped int64
	// ResolvedCompleted and ResolvedReleased count the unknown records the
	// reconciler settled to each state (idem_maint_resolved_total{state}).
	ResolvedCompleted, ResolvedReleased int64
	// ReconcileErrors counts the reconciliation calls that failed
	// (idem_maint_reconcile_errors_total).
	ReconcileErrors int64
	// ReconcileScheduled counts the reconciliation attempts that left a
	// record unknown and scheduled the next one after a backoff
	// (idem_reconcile_scheduled_total).
	ReconcileScheduled int64
	// PassErrors counts the maintenance passes that failed
	// (idem_maint_pass_errors_total).
	PassErrors int64
}

var (
	descUnknownBacklog = prometheus.NewDesc("idem_unknown_backlog",
		"Unknown idempotency records awaiting reconciliation, counted in the store.", nil, nil)
	descOldestUnknown = prometheus.NewDesc("idem_unknown_oldest_age_seconds",
		"Age of the oldest unknown idempotency record since it turned unknown; 0 when there is none.", nil, nil)
	descReconcileScheduled = prometheus.NewDesc("idem_reconcile_scheduled_total",
		"Reconciliation attempts that left a record unknown and scheduled its next attempt after a backoff.", nil, nil)
	descUnknownTruncated = prometheus.NewDesc("idem_unknown_backlog_truncated",
		"1 when the unknown backlog count stopped at the scan limit, so the backlog is at least idem_unknown_backlog.", nil, nil)
	descUnresolved = prometheus.NewDesc("idem_unknown_unresolved",
		"Unknown idempotency records the reconciler tried and could not resolve yet.", nil, nil)
	descReconcileLeft = prometheus.NewDesc("idem_reconcile_left",
		"Due unknown idempotency records the last reconciliation pass had no time to ask about, left for the next pass.", nil, nil)
	descOldestInProgress = prometheus.NewDesc("idem_oldest_in_progress_seconds",
		"Age of the oldest in-progress idempotency record with a live lease; 0 when there is none.", nil, nil)
	descOutboxDepth = prometheus.NewDesc("idem_outbox_depth",
		"Outbox messages waiting for delivery.", nil, nil)
	descDeadLetters = prometheus.NewDesc("idem_outbox_dead_letters",
		"Outbox messages dead-lettered after their last attempt.", nil, nil)
	descSwept = prometheus.NewDesc("idem_maint_swept_total",
		"Expired leases the sweeper settled.", nil, nil)
	descReaped = prometheus.NewDesc("idem_maint_reaped_total",
		"Idempotency records the reaper deleted past their retention.", nil, nil)
	descResolved = prometheus.NewDesc("idem_maint_resolved_total",
		"Unknown idempotency records the reconciler settled, by the state they were settled to.", []string{"state"}, nil)
	descReconcileErrors = prometheus.NewDesc("idem_maint_reconcile_errors_total",
		"Reconciliation calls that failed, panicked or returned an invalid resolution.", nil, nil)
	descPassErrors = prometheus.NewDesc("idem_maint_pass_errors_total",
		"Maintenance passes that ended with an error.", nil, nil)
)

// maintainerCollector exports MaintainerStats read from a callback.
type maintainerCollector struct {
	stats func() MaintainerStats
}

// NewMaintainerCollector returns a collector that calls stats on every scrape
// and exports its values. stats must be safe for concurrent use and fast:
// values measured in the background (the maintainer's Stats snapshot), or
// cheap store counts bounded by a short timeout (the unknown backlog, from
// an index; the outbox depth).
func NewMaintainerCollector(stats func() MaintainerStats) prometheus.Collector {
	return &maintainerCollector{stats: stats}
}

// RegisterMaintainer registers NewMaintainerCollector(stats) with reg
// (prometheus.DefaultRegisterer when reg is nil).
func RegisterMaintainer(reg prometheus.Registerer, stats func() MaintainerStats) error {
	if reg == nil {
		reg = prometheus.DefaultRegisterer
	}
	return reg.Register(NewMaintainerCollector(stats))
}

// Describe sends the descriptions of every series the collector may export.
func (c *maintainerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		descUnknownBacklog, descUnknownTruncated, descUnresolved, descReconcileLeft, descOldestInProgress,
		descOldestUnknown, descOutboxDepth, descDeadLetters,
		descSwept, descReaped, descResolved, descReconcileErrors, descReconcileScheduled, descPassErrors,
	} {
		ch <- d
	}
}

// Collect reads the stats once and sends their values.
func (c *maintainerCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge(descUnknownBacklog, float64(s.UnknownBacklog))
	truncated := 0.0
	if s.UnknownBacklogTruncated {
		truncated = 1
	}
	gauge(descUnknownTruncated, truncated)
	gauge(descUnresolved, float64(s.Unresolved))
	gauge(descReconcileLeft, float64(s.ReconcileLeft))
	gauge(descOldestInProgress, s.OldestInProgress.Seconds())
	gauge(descOldestUnknown, s.OldestUnknown.Seconds())
	if s.Outbox {
		gauge(descOutboxDepth, float64(s.OutboxDepth))
		gauge(descDeadLetters, float64(s.DeadLetters))
	}
	counter(descSwept, s.Swept)
	counter(descReaped, s.Reaped)
	counter(descResolved, s.ResolvedCompleted, "completed")
	counter(descResolved, s.ResolvedReleased, "released")
	counter(descReconcileErrors, s.ReconcileErrors)
	counter(descReconcileScheduled, s.ReconcileScheduled)
	counter(descPassErrors, s.PassErrors)
}
