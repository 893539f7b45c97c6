package idemmysql

import (
	"context"
	"database/sql"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idem-dev/idem/idemstore"
)

// MySQL's error numbers that the store handles.
const (
	errLockWaitTimeout = 1205 // ER_LOCK_WAIT_TIMEOUT
	errDeadlock        = 1213 // ER_LOCK_DEADLOCK
)

// interpretError maps the driver's native errors to the idemstore
// sentinels: sql.ErrNoRows is idemstore.ErrNotFound, and the sentinels pass
// unchanged. Every other error means the store is unavailable and is
// returned unchanged.
func interpretError(err error) error {
	if errors.Is(err, sql.ErrNoRows) {
		return idemstore.ErrNotFound
	}
	return err
}

// retryable reports whether err is a deadlock or a lock wait timeout, after
// which MySQL has rolled back the statement (a deadlock: the whole
// transaction), so that it may simply run again.
func retryable(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == errDeadlock || me.Number == errLockWaitTimeout)
}

// Bounds of retry.
const (
	retryFirstWait = 2 * time.Millisecond
	retryMaxWait   = 200 * time.Millisecond
	// retryMaxTries bounds the runs of a call whose context has no
	// deadline.
	retryMaxTries = 20
)

// retry runs f, and runs it again after a deadlock or a lock wait timeout,
// with jittered exponential backoff, while ctx lasts (at most retryMaxTries
// runs). f must be a whole unit of work that MySQL rolled back on such an
// error: an autocommitted statement or a transaction of the store's own.
func (s *Store) retry(ctx context.Context, f func() error) error {
	wait := retryFirstWait
	for try := 1; ; try++ {
		err := f()
		if !retryable(err) || try == retryMaxTries {
			return err
		}
		d := wait/2 + rand.N(wait/2+1)
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < d {
			return err
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait = min(2*wait, retryMaxWait)
	}
}
