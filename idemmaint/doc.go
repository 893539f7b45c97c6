// Package idemmaint runs the background maintenance of an idem store: the
// sweeper, the reaper and the reconciler.
//
//   - The sweeper turns in_progress records whose lease expired into their
//     lease-expired state (unknown, or released in transactional mode) and
//     logs each one.
//   - The reaper deletes settled records past their retention (never an
//     unknown one) in bounded batches, one
//     statement per batch, so live traffic is never blocked behind a long
//     delete.
//   - The reconciler hands every unknown record to a function the
//     application supplies (Config.Reconcile), which asks the downstream by
//     the derived key whether the effect happened, and settles the record to
//     completed or released with a write fenced on the record's token.
//     It never asks about a record before its lease ended plus
//     Config.Grace, the longest time the downstream may still act on a
//     request it was sent: asked earlier, the downstream could answer
//     "never happened" for an operation about to happen. Records it
//     cannot resolve yet are retried with exponential backoff and jitter,
//     logged at warn with their attempt count and counted in Stats.
//     HTTPReconciler is such a function for any HTTP API with a lookup by
//     key: it GETs a URLTemplate filled in with the record's key (2xx
//     completed with that answer, 404/410 released, anything else unknown),
//     and never asks about a record whose values would change the lookup's
//     path, nor about a scoped record by a template without {scope}.
//     The reconciliation state lives in the store: each pass claims the due
//     records it can reconcile in its time (KeyReconcileClaim), asks about
//     them Config.ReconcileConcurrency at a time, and records every failed
//     attempt with its error and next time (KeyReconcileFail), so a
//     restarted process or another node carries on where the last one
//     stopped.
//
// Library users run a Maintainer in their own process:
//
//	m := idemmaint.New(store, &idemmaint.Config{Reconcile: reconcile})
//	if err := m.Start(ctx); err != nil { ... }
//	defer m.Stop()
//
// The three jobs run independently, each on its own interval, with a
// timeout and bounded batches per pass; RunOnce runs one pass of each (for a
// cron-style "maintain --once"). Several maintainers may run against one
// shared store: sweeping, reaping and resolving are atomic store operations,
// a record is claimed by one reconciler at a time (for the pass), and
// resolutions are fenced on the record's token, so a record settled by one
// maintainer is skipped by the others (the loser logs it at info).
//
// Stats returns counters and gauges for metrics: totals swept, reaped and
// reconciled, attempts scheduled again, the unknown backlog and the age of
// the oldest unknown record (both counted in the store, so every node reports
// the same), the unresolved records and the age of the oldest in-progress
// attempt.
//
// Logs never carry a raw idempotency key: records are named by key_hash, a
// short SHA-256 of their scope, endpoint and key (the same hash the
// middleware logs), with their endpoint and scope.
package idemmaint
