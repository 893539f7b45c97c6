package idemsqlite_test

import (
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"
)

// BenchmarkCommitFloor measures what the disk allows SQLite, as the store
// opens it (WAL, synchronous=FULL, the same driver), without the store:
// transactions of rows=k single-row inserts on a table of two columns, one
// after the other, each durable at its commit. Its commits/s is the floor of
// the group commit's cycle: a new key needs two durable commits in
// sequence (the reservation's, then the completion's), so with w writes per
// commit a store on this disk serves at most commits/s × w / 2 new keys per
// second, whatever the CPU. Timing, not a load-independent count: run it
// on a quiet machine.
//
//	go test -run '^$' -bench CommitFloor -benchtime 3s ./idemsqlite
func BenchmarkCommitFloor(b *testing.B) {
	for _, rows := range []int{1, 2, 4, 8, 16} {
		b.Run(fmt.Sprint("rows=", rows), func(b *testing.B) {
			db, err := sql.Open("sqlite", filepath.Join(b.TempDir(), "floor.db")+
				"?_journal_mode=WAL&_synchronous=FULL&_txlock=immediate&_busy_timeout=5000")
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			db.SetMaxOpenConns(1)
			ctx := b.Context()
			if _, err := db.ExecContext(ctx, `CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB NOT NULL)`); err != nil {
				b.Fatal(err)
			}
			v := make([]byte, 200)
			i := 0
			defer reportCPU(b)()
			for b.Loop() {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					b.Fatal(err)
				}
				for range rows {
					i++
					if _, err := tx.ExecContext(ctx, `INSERT INTO t (id, v) VALUES (?, ?)`, i, v); err != nil {
						b.Fatal(err)
					}
				}
				if err := tx.Commit(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "commits/s")
		})
	}
}
