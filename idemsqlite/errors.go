package idemsqlite

import (
	"database/sql"
	"errors"
	"fmt"

	"github.com/idem-dev/idem/idemstore"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// interpretError maps a driver error of operation op to the store's errors:
// the idemstore sentinels pass unchanged, sql.ErrNoRows becomes
// idemstore.ErrNotFound, and anything else (a busy or broken database, a
// cancelled context) is wrapped with op and means the store is unavailable.
func interpretError(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, idemstore.ErrNotFound) || errors.Is(err, idemstore.ErrLeaseLost) ||
		errors.Is(err, idemstore.ErrInvalidState) {
		return err
	}
	if errors.Is(err, sql.ErrNoRows) {
		return idemstore.ErrNotFound
	}
	var serr *sqlite.Error
	if errors.As(err, &serr) {
		switch serr.Code() & 0xff {
		case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
			return fmt.Errorf("%s: database is locked by another connection: %w", op, err)
		case sqlite3.SQLITE_CONSTRAINT:
			return fmt.Errorf("%s: constraint violated (a bug): %w", op, err)
		}
	}
	return fmt.Errorf("%s: %w", op, err)
}
