package idemtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// waitBound is how long a KeyWait that should return may take.
const waitBound = 10 * time.Second

func testWait(t *testing.T, setup setupFunc) {
	if _, ok := setup(t).store.(idemstore.Waiter); !ok {
		t.Skip("the store does not implement idemstore.Waiter")
	}
	// startWait calls KeyWait(id) on its own goroutine.
	startWait := func(ctx context.Context, b *bundle, id idemstore.Identity) <-chan error {
		done := make(chan error, 1)
		go func() { done <- b.store.(idemstore.Waiter).KeyWait(ctx, id) }()
		return done
	}
	requireReturns := func(t *testing.T, what string, done <-chan error) error {
		t.Helper()
		select {
		case err := <-done:
			return err
		case <-time.After(waitBound):
			t.Fatalf("%s: KeyWait did not return within %v", what, waitBound)
			return nil
		}
	}

	t.Run("ReturnsWhenNotInProgress", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx, cancel := context.WithTimeout(b.ctx, 2*waitBound)
		defer cancel()
		if err := requireReturns(t, "missing record", startWait(ctx, b, b.id)); err != nil {
			t.Fatalf("KeyWait of a missing record = %v, want nil", err)
		}
		for i, finish := range []func(id idemstore.Identity, token string){
			func(id idemstore.Identity, token string) { b.complete(t, id, token, sampleResponse()) },
			func(id idemstore.Identity, token string) { b.release(t, id, token) },
			func(id idemstore.Identity, token string) { b.markUnknown(t, id, token) },
		} {
			id := b.id
			id.Key = []string{"completed", "released", "unknown"}[i]
			p := b.params(id)
			b.reserveNew(t, p)
			finish(id, p.Token)
			if err := requireReturns(t, id.Key+" record", startWait(ctx, b, id)); err != nil {
				t.Fatalf("KeyWait of a %s record = %v, want nil", id.Key, err)
			}
		}
	})

	t.Run("WakesOnChange", func(t *testing.T) {
		t.Parallel()
		for _, tt := range []struct {
			name   string
			change func(t *testing.T, b *bundle, token string)
		}{
			{"Complete", func(t *testing.T, b *bundle, token string) { b.complete(t, b.id, token, sampleResponse()) }},
			{"Release", func(t *testing.T, b *bundle, token string) { b.release(t, b.id, token) }},
			{"MarkUnknown", func(t *testing.T, b *bundle, token string) { b.markUnknown(t, b.id, token) }},
			{"Delete", func(t *testing.T, b *bundle, token string) {
				if err := b.store.KeyDelete(b.ctx, &idemstore.FinishParams{Identity: b.id, Token: token}); err != nil {
					t.Fatalf("KeyDelete: %v", err)
				}
			}},
		} {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				p := b.params(b.id)
				p.Lease = time.Hour
				b.reserveNew(t, p)
				ctx, cancel := context.WithTimeout(b.ctx, 2*waitBound)
				defer cancel()
				const waiters = 3
				var dones []<-chan error
				for range waiters {
					dones = append(dones, startWait(ctx, b, b.id))
				}
				// Whether a waiter started before or after the change, it
				// must return: woken, or finding the record finished.
				tt.change(t, b, p.Token)
				for _, done := range dones {
					if err := requireReturns(t, "after "+tt.name, done); err != nil {
						t.Fatalf("KeyWait after %s = %v, want nil", tt.name, err)
					}
				}
			})
		}
	})

	t.Run("Cancel", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.params(b.id)
		p.Lease = time.Hour
		b.reserveNew(t, p)
		ctx, cancel := context.WithCancel(b.ctx)
		done := startWait(ctx, b, b.id)
		cancel()
		// A spurious wake-up (nil) is allowed; any error must be ctx's.
		if err := requireReturns(t, "after cancel", done); err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("KeyWait after its context was canceled = %v, want context.Canceled", err)
		}
	})
}
