package idemcrypt

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/idem-dev/idem/idemstore"
)

// Defaults of the RotateConfig fields.
const (
	DefaultRotateBatch     = 500
	DefaultRotateMaxPasses = 10
)

// ErrRotationUnsettled is returned by Rotate when its last pass (the
// RotateConfig.MaxPasses-th) still found records to rewrite: something is
// still storing responses under another key, most likely a process running
// with an old keys file (one whose first key is not the sealing key).
var ErrRotationUnsettled = errors.New("idemcrypt: records are still being sealed under another key after the last pass (is a process still running with an old keys file?)")

// RotateConfig configures Rotate. A nil *RotateConfig means all defaults.
type RotateConfig struct {
	// Batch is how many records are listed and rewritten per step.
	// Defaults to DefaultRotateBatch.
	Batch int
	// After resumes a rotation after this record (the Cursor of a
	// RotateProgress): its first pass starts there, and the next ones from
	// the start. Defaults to the start. Rotating again from the start is
	// also safe: records already under the sealing key are skipped.
	After *idemstore.Identity
	// MaxPasses bounds the passes over the records: Rotate passes again
	// from the start until a whole pass finds nothing to rewrite, and
	// fails with ErrRotationUnsettled when the last allowed pass still
	// found some. Defaults to DefaultRotateMaxPasses.
	MaxPasses int
	// Progress, when set, is called after every batch with the totals so
	// far. Defaults to none.
	Progress func(RotateProgress)
}

// RotateProgress counts what Rotate did, over every pass so far (a record
// is looked at once per pass), except Unopenable, which is the current
// pass's.
type RotateProgress struct {
	// Passes is the number of the pass under way (1 for the first); at the
	// end, the number of passes made.
	Passes int
	// Scanned counts the completed records looked at.
	Scanned int
	// Resealed counts the responses rewritten under the sealing key: those
	// sealed under another key or in format v1, and those stored in the
	// clear.
	Resealed int
	// Current counts the responses already under the sealing key, and
	// records with no stored response.
	Current int
	// Gone counts records that changed or expired between the listing and
	// the rewrite (a new incarnation of the key is sealed when stored).
	Gone int
	// Unopenable counts the responses the current pass could not open, by
	// the name of the key that sealed them: keys missing from the keyring,
	// or a response that does not authenticate. They are left as they are,
	// and do not make Rotate pass again.
	Unopenable map[string]int
	// Cursor is the last record of the last batch: pass it as
	// RotateConfig.After to resume.
	Cursor *idemstore.Identity
}

// Failed returns the number of responses that could not be opened.
func (p RotateProgress) Failed() int {
	n := 0
	for _, c := range p.Unopenable {
		n += c
	}
	return n
}

// FailedKeys returns the names of the keys of the responses that could not
// be opened, sorted.
func (p RotateProgress) FailedKeys() []string {
	return slices.Sorted(maps.Keys(p.Unopenable))
}

// Rotate rewrites every completed record's response under kr's sealing key,
// in batches of cfg.Batch: responses sealed under another key of kr, or in
// the former format v1 (which does not bind the fingerprint and the
// creation time), are opened and sealed again, responses stored in the
// clear are sealed. It works on the records as stored, so store is the
// store below the encrypting wrapper (a store New returned is unwrapped),
// and it must implement idemstore.Resealer.
//
// One pass is not enough while any process still seals with an old
// keyring: a record it stores behind the pass's cursor is never seen by
// that pass. So Rotate passes again from the start until a whole pass
// rewrites nothing (and no record changed under it meanwhile), at most
// cfg.MaxPasses times; then it fails with ErrRotationUnsettled.
//
// Each rewrite is fenced on the record's token, so a record replaced by a
// new incarnation meanwhile is left alone (counted in Gone, and looked at
// again by the next pass). A response that cannot be opened is counted in
// Unopenable and left as it is; the rotation goes on. Rotate stops at
// ctx's end and returns the progress so far with the error; resume with
// its Cursor.
//
// While it runs, processes with the old keyring keep replaying: every
// record is at all times sealed under the old key or the new one, so keep
// the old key in every keyring until Rotate has reported no failures.
func Rotate(ctx context.Context, store idemstore.Store, kr *Keyring, cfg *RotateConfig) (RotateProgress, error) {
	var c RotateConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Batch <= 0 {
		c.Batch = DefaultRotateBatch
	}
	if c.MaxPasses <= 0 {
		c.MaxPasses = DefaultRotateMaxPasses
	}
	prog := RotateProgress{Unopenable: map[string]int{}}
	if kr == nil {
		return prog, errors.New("idemcrypt: Rotate needs a keyring")
	}
	if w, ok := store.(interface{ Unwrap() idemstore.Store }); ok {
		if _, isCrypt := store.(interface{ Keyring() *Keyring }); isCrypt {
			store = w.Unwrap()
		}
	}
	rs, ok := store.(idemstore.Resealer)
	if !ok {
		return prog, fmt.Errorf("idemcrypt: %T cannot rewrite stored responses (no KeyReseal)", store)
	}
	after := c.After
	for pass := 1; ; pass++ {
		prog.Passes = pass
		clear(prog.Unopenable)
		prog.Cursor = nil
		if after != nil {
			a := *after
			prog.Cursor = &a
		}
		changed := prog.Resealed + prog.Gone
		if err := rotatePass(ctx, store, rs, kr, &c, &prog); err != nil {
			return prog, err
		}
		// Only a whole pass that changed nothing shows that nothing is
		// left: a pass resumed from a cursor did not see the records
		// before it.
		if after == nil && prog.Resealed+prog.Gone == changed {
			return prog, nil
		}
		if pass >= c.MaxPasses {
			return prog, fmt.Errorf("%w: %d passes", ErrRotationUnsettled, pass)
		}
		after = nil
	}
}

// rotatePass makes one pass over the completed records, from prog.Cursor
// to the end.
func rotatePass(ctx context.Context, store idemstore.Store, rs idemstore.Resealer, kr *Keyring, c *RotateConfig, prog *RotateProgress) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		page, err := store.KeyList(ctx, &idemstore.ListParams{
			State: idemstore.StateCompleted, After: prog.Cursor, Limit: c.Batch,
		})
		if err != nil {
			return fmt.Errorf("listing records: %w", err)
		}
		for _, rec := range page {
			if err := rotateOne(ctx, rs, kr, rec, prog); err != nil {
				return err
			}
			id := rec.Identity
			prog.Cursor = &id
		}
		if len(page) > 0 && c.Progress != nil {
			c.Progress(*prog)
		}
		if len(page) < c.Batch {
			return nil
		}
	}
}

func rotateOne(ctx context.Context, rs idemstore.Resealer, kr *Keyring, rec *idemstore.Record, prog *RotateProgress) error {
	prog.Scanned++
	if rec.Response == nil || rec.NotReplayable {
		prog.Current++
		return nil
	}
	name, _ := SealedBy(rec.Response)
	if current(rec.Response) && name == kr.Primary() {
		prog.Current++
		return nil
	}
	plain, err := kr.Open(BindingOf(rec), rec.Response)
	if err != nil {
		prog.Unopenable[name]++
		return nil
	}
	resp, err := kr.Seal(BindingOf(rec), plain)
	if err != nil {
		return err
	}
	err = rs.KeyReseal(ctx, &idemstore.ResealParams{Identity: rec.Identity, Token: rec.Token, Response: resp})
	switch {
	case err == nil:
		prog.Resealed++
	case errors.Is(err, idemstore.ErrLeaseLost), errors.Is(err, idemstore.ErrInvalidState):
		prog.Gone++
	default:
		return fmt.Errorf("rewriting record %s: %w", rec.LogHash(), err)
	}
	return nil
}
