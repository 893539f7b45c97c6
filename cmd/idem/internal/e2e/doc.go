// Package e2e holds the end-to-end proofs of idem on PostgreSQL: several
// `idem proxy` processes on one database, processes killed mid-request,
// phased operations resumed after crashes, and a database outage. It has no
// code of its own; everything is in its tests, which need the PostgreSQL of
// internal/testenv and build the idem command once per run.
package e2e
