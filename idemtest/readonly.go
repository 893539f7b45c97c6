package idemtest

import (
	"bytes"
	"context"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/idem-dev/idem/idemstore"
)

// CheckReserveResults returns store wrapped so that t fails when a record
// KeyReserve returned is changed afterwards, by its caller or by the store.
//
// idemstore.ReserveResult.Record is read-only for the caller because a store
// may share it (idemmem answers a replay with the stored record itself, its
// headers and body included). A test that runs a caller, such as the
// middleware, over this wrapper proves that the caller keeps to that; a
// store's test proves that the store never changes a record it handed out.
//
// The wrapper keeps a deep copy of every record it returns and compares each
// with its copy when the test ends. It keeps the store's Waiter and TxStore
// methods, and no other optional one.
func CheckReserveResults(t testing.TB, store idemstore.Store) idemstore.Store {
	c := &checkedStore{Store: store}
	t.Cleanup(func() { c.check(t) })
	w, isWaiter := store.(idemstore.Waiter)
	ts, isTx := store.(idemstore.TxStore)
	switch {
	case isWaiter && isTx:
		return struct {
			*checkedStore
			idemstore.Waiter
			beginner
		}{c, w, beginner{ts}}
	case isWaiter:
		return struct {
			*checkedStore
			idemstore.Waiter
		}{c, w}
	case isTx:
		return struct {
			*checkedStore
			beginner
		}{c, beginner{ts}}
	}
	return c
}

// beginner forwards KeyBeginTx only (an embedded TxStore would bring a
// second set of Store methods).
type beginner struct{ ts idemstore.TxStore }

func (b beginner) KeyBeginTx(ctx context.Context) (idemstore.Tx, error) {
	return b.ts.KeyBeginTx(ctx)
}

type checkedStore struct {
	idemstore.Store
	mu     sync.Mutex
	handed []handedRecord
}

// handedRecord is a record KeyReserve returned and a deep copy of it then.
type handedRecord struct {
	rec, was *idemstore.Record
}

// KeyReserve is the wrapped store's KeyReserve; it remembers the record.
func (c *checkedStore) KeyReserve(ctx context.Context, p *idemstore.ReserveParams) (*idemstore.ReserveResult, error) {
	res, err := c.Store.KeyReserve(ctx, p)
	if err == nil && res != nil && res.Record != nil {
		c.mu.Lock()
		c.handed = append(c.handed, handedRecord{rec: res.Record, was: deepCopy(res.Record)})
		c.mu.Unlock()
	}
	return res, err
}

func (c *checkedStore) check(t testing.TB) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, h := range c.handed {
		if changed := changedFields(h.was, h.rec); len(changed) > 0 {
			t.Errorf("idemtest: the record of %s that KeyReserve returned was changed afterwards (%s); "+
				"ReserveResult.Record is read-only:\nwas %s\nnow %s",
				h.was.LogHash(), strings.Join(changed, ", "), describe(h.was), describe(h.rec))
		}
	}
}

func deepCopy(r *idemstore.Record) *idemstore.Record {
	c := *r
	if r.Response != nil {
		c.Response = &idemstore.Response{Status: r.Response.Status, Header: r.Response.Header.Clone(), Body: bytes.Clone(r.Response.Body), Sealed: r.Response.Sealed}
	}
	return &c
}

// changedFields names the fields of the records that differ.
func changedFields(a, b *idemstore.Record) []string {
	va, vb := reflect.ValueOf(a).Elem(), reflect.ValueOf(b).Elem()
	var out []string
	for i := range va.NumField() {
		if !reflect.DeepEqual(va.Field(i).Interface(), vb.Field(i).Interface()) {
			out = append(out, va.Type().Field(i).Name)
		}
	}
	return out
}

func describe(r *idemstore.Record) string {
	c := *r
	c.Response = nil
	s := fmt.Sprintf("%+v", c)
	if resp := r.Response; resp != nil {
		s += fmt.Sprintf("\n    response: status %d, header %v, body %q", resp.Status, resp.Header, resp.Body)
	}
	return s
}
