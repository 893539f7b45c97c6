package idemtest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemcrypt"
	"github.com/idem-dev/idem/idemstore"
)

// The encryption tests (testEncryption) pin down, for every store:
//
//   - KeyReseal (idemstore.Resealer) rewrites the response of a live,
//     completed, replayable record with the right token and nothing else;
//     it is fenced like the other writes.
//   - Through idemcrypt.New a response round-trips by every read path
//     (KeyReserve, KeyGet, KeyList), while the store itself holds no byte
//     of its header values or body.
//   - A response never opens under a wrong key, under a keyring without its
//     key (the error names the key), or on another record (moved
//     ciphertext).
//   - idemcrypt.Rotate moves every response under the newest key in
//     bounded, resumable batches, a keyring with only the old key opening
//     every record until it has.
//   - The core suite passes with the store wrapped.

// cryptoMarker is the text every sealed test response carries in its body
// and its header values, which the raw records must not contain.
const cryptoMarker = "SECRET-4242-card"

func secretResponse() *idemstore.Response {
	return &idemstore.Response{
		Status: 201,
		Header: map[string][]string{
			"Content-Type": {"application/json"},
			"Location":     {"/v1/payments/" + cryptoMarker},
		},
		Body: []byte(`{"card":"` + cryptoMarker + `"}`),
	}
}

func newKeyring(t *testing.T, names ...string) *idemcrypt.Keyring {
	t.Helper()
	return NewTestKeyring(t, names...)
}

// requireSealed fails unless the record as stored is sealed under key name
// and shows no byte of its plaintext.
func requireSealed(t *testing.T, r *idemstore.Record, name string) {
	t.Helper()
	if r.Response == nil {
		t.Fatalf("record %+v: no stored response", r.Identity)
	}
	if got, ok := idemcrypt.SealedBy(r.Response); !ok || got != name {
		t.Fatalf("record %+v: stored response sealed %v by %q, want sealed by %q", r.Identity, ok, got, name)
	}
	raw := fmt.Sprint(r.Response.Header) + string(r.Response.Body)
	if strings.Contains(raw, cryptoMarker) || strings.Contains(raw, "/v1/payments") || strings.Contains(raw, "application/json") {
		t.Fatalf("record %+v: the stored response shows plaintext: %q", r.Identity, raw)
	}
}

// completeWith reserves id on store and completes it with resp.
func (b *bundle) completeWith(t *testing.T, store idemstore.Store, id idemstore.Identity, resp *idemstore.Response) string {
	t.Helper()
	p := b.params(id)
	res, err := store.KeyReserve(b.ctx, p)
	if err != nil || !res.Reserved {
		t.Fatalf("KeyReserve(%+v) = %+v, %v; want reserved", id, res, err)
	}
	if err := store.KeyComplete(b.ctx, &idemstore.CompleteParams{Identity: id, Token: p.Token, Response: resp}); err != nil {
		t.Fatalf("KeyComplete(%+v): %v", id, err)
	}
	return p.Token
}

func testEncryption(t *testing.T, setup setupFunc) {
	t.Run("Reseal", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		rs, ok := b.store.(idemstore.Resealer)
		if !ok {
			t.Skipf("%T does not implement idemstore.Resealer", b.store)
		}
		token := b.completeWith(t, b.store, b.id, sampleResponse())
		before := b.get(t, b.id)
		b.clock.Advance(5 * time.Second)
		other := secretResponse()
		for _, bad := range []struct {
			name string
			p    idemstore.ResealParams
			want error
		}{
			{"WrongToken", idemstore.ResealParams{Identity: b.id, Token: "token-other", Response: other}, idemstore.ErrLeaseLost},
			{"Missing", idemstore.ResealParams{Identity: idemstore.Identity{Scope: "s", Endpoint: "POST /x", Key: "missing"}, Token: token, Response: other}, idemstore.ErrLeaseLost},
		} {
			if err := rs.KeyReseal(b.ctx, &bad.p); !errors.Is(err, bad.want) {
				t.Fatalf("%s: KeyReseal = %v, want %v", bad.name, err, bad.want)
			}
		}
		requireResponse(t, b.get(t, b.id), sampleResponse())

		if err := rs.KeyReseal(b.ctx, &idemstore.ResealParams{Identity: b.id, Token: token, Response: other}); err != nil {
			t.Fatalf("KeyReseal: %v", err)
		}
		after := b.get(t, b.id)
		requireResponse(t, after, other)
		requireResponse(t, b.reserveExisting(t, b.params(b.id)), other)
		if after.State != idemstore.StateCompleted || after.Token != token || !after.UpdatedAt.Equal(before.UpdatedAt) ||
			!after.ExpiresAt.Equal(before.ExpiresAt) || after.Fingerprint != before.Fingerprint {
			t.Fatalf("KeyReseal changed more than the response: before %+v, after %+v", before, after)
		}

		// In progress: not completed.
		inProgress := idemstore.Identity{Scope: b.id.Scope, Endpoint: b.id.Endpoint, Key: b.id.Key + "-in-progress"}
		held := b.reserveNew(t, b.params(inProgress))
		if err := rs.KeyReseal(b.ctx, &idemstore.ResealParams{Identity: inProgress, Token: held.Token, Response: other}); !errors.Is(err, idemstore.ErrInvalidState) {
			t.Fatalf("KeyReseal of an in_progress record = %v, want ErrInvalidState", err)
		}
		// Not replayable.
		nr := idemstore.Identity{Scope: b.id.Scope, Endpoint: b.id.Endpoint, Key: b.id.Key + "-not-replayable"}
		p := b.params(nr)
		b.reserveNew(t, p)
		if err := b.store.KeyComplete(b.ctx, &idemstore.CompleteParams{Identity: nr, Token: p.Token, NotReplayable: true}); err != nil {
			t.Fatal(err)
		}
		if err := rs.KeyReseal(b.ctx, &idemstore.ResealParams{Identity: nr, Token: p.Token, Response: other}); !errors.Is(err, idemstore.ErrInvalidState) {
			t.Fatalf("KeyReseal of a not replayable record = %v, want ErrInvalidState", err)
		}
		if r := b.get(t, nr); !r.NotReplayable || r.Response != nil {
			t.Fatalf("a refused KeyReseal changed the not replayable record: %+v", r)
		}
		// Expired: gone.
		b.clock.Advance(testTTL)
		if err := rs.KeyReseal(b.ctx, &idemstore.ResealParams{Identity: b.id, Token: token, Response: sampleResponse()}); !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Fatalf("KeyReseal of an expired record = %v, want ErrLeaseLost", err)
		}
	})

	t.Run("RoundTrip", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		kr := newKeyring(t, "k1")
		enc := idemcrypt.New(b.store, kr)
		b.completeWith(t, enc, b.id, secretResponse())
		requireSealed(t, b.get(t, b.id), "k1")

		res, err := enc.KeyReserve(b.ctx, b.params(b.id))
		if err != nil || res.Reserved {
			t.Fatalf("KeyReserve = %+v, %v; want the completed record", res, err)
		}
		requireResponse(t, res.Record, secretResponse())
		got, err := enc.KeyGet(b.ctx, b.id)
		if err != nil {
			t.Fatal(err)
		}
		requireResponse(t, got, secretResponse())
		list, err := enc.KeyList(b.ctx, &idemstore.ListParams{Scope: b.id.Scope})
		if err != nil || len(list) != 1 {
			t.Fatalf("KeyList = %d records, %v; want 1", len(list), err)
		}
		requireResponse(t, list[0], secretResponse())
		// The record as stored is untouched by the reads.
		requireSealed(t, b.get(t, b.id), "k1")

		// Resolving an unknown record seals too.
		unk := idemstore.Identity{Scope: b.id.Scope, Endpoint: b.id.Endpoint, Key: b.id.Key + "-resolved"}
		p := b.params(unk)
		b.reserveNew(t, p)
		if err := b.store.KeyMarkUnknown(b.ctx, &idemstore.FinishParams{Identity: unk, Token: p.Token}); err != nil {
			t.Fatal(err)
		}
		if err := enc.KeyResolve(b.ctx, &idemstore.ResolveParams{Identity: unk, Token: p.Token, To: idemstore.StateCompleted, Response: secretResponse()}); err != nil {
			t.Fatalf("KeyResolve: %v", err)
		}
		requireSealed(t, b.get(t, unk), "k1")
		got, err = enc.KeyGet(b.ctx, unk)
		if err != nil {
			t.Fatal(err)
		}
		requireResponse(t, got, secretResponse())

		// A response stored in the clear (before encryption was turned on)
		// still replays.
		plain := idemstore.Identity{Scope: b.id.Scope, Endpoint: b.id.Endpoint, Key: b.id.Key + "-plain"}
		b.completeWith(t, b.store, plain, sampleResponse())
		got, err = enc.KeyGet(b.ctx, plain)
		if err != nil {
			t.Fatal(err)
		}
		requireResponse(t, got, sampleResponse())
	})

	t.Run("WrongKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.completeWith(t, idemcrypt.New(b.store, newKeyring(t, "k1")), b.id, secretResponse())
		for _, tt := range []struct {
			name string
			kr   *idemcrypt.Keyring
			want error
		}{
			{"SameNameOtherMaterial", newKeyring(t, "k1"), idemcrypt.ErrOpen},
			{"KeyMissing", newKeyring(t, "k2"), idemcrypt.ErrUnknownKey},
			{"NoKeyring", nil, idemcrypt.ErrUnknownKey},
		} {
			enc := idemcrypt.New(b.store, tt.kr)
			res, err := enc.KeyReserve(b.ctx, b.params(b.id))
			if !errors.Is(err, tt.want) {
				t.Fatalf("%s: KeyReserve = %+v, %v; want %v", tt.name, res, err, tt.want)
			}
			var ke *idemcrypt.KeyError
			if !errors.As(err, &ke) || ke.Name != "k1" || !strings.Contains(err.Error(), `"k1"`) {
				t.Fatalf("%s: error %v does not name the key k1", tt.name, err)
			}
			if strings.Contains(err.Error(), cryptoMarker) {
				t.Fatalf("%s: the error shows the response: %v", tt.name, err)
			}
			if _, err := enc.KeyGet(b.ctx, b.id); !errors.Is(err, tt.want) {
				t.Fatalf("%s: KeyGet = %v, want %v", tt.name, err, tt.want)
			}
			// A list does not fail for it: the record is listed with its
			// response as stored, sealed under the key it names.
			list, err := enc.KeyList(b.ctx, &idemstore.ListParams{Scope: b.id.Scope})
			if err != nil || len(list) != 1 {
				t.Fatalf("%s: KeyList = %d records, %v; want the record", tt.name, len(list), err)
			}
			requireSealed(t, list[0], "k1")
		}
	})

	t.Run("MovedCiphertext", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		kr := newKeyring(t, "k1")
		enc := idemcrypt.New(b.store, kr)
		b.completeWith(t, enc, b.id, secretResponse())
		stolen := b.get(t, b.id).Response
		requireSealed(t, b.get(t, b.id), "k1")

		// The same ciphertext stored on another record, of another key, of
		// another tenant and of another endpoint, never opens there.
		for _, to := range []idemstore.Identity{
			{Scope: b.id.Scope, Endpoint: b.id.Endpoint, Key: b.id.Key + "-victim"},
			{Scope: b.id.Scope + "-other", Endpoint: b.id.Endpoint, Key: b.id.Key},
			{Scope: b.id.Scope, Endpoint: b.id.Endpoint + "/other", Key: b.id.Key},
		} {
			b.completeWith(t, b.store, to, stolen)
			if r, err := enc.KeyGet(b.ctx, to); !errors.Is(err, idemcrypt.ErrOpen) {
				t.Fatalf("moved to %+v: KeyGet = %+v, %v; want ErrOpen", to, r, err)
			}
			if _, err := enc.KeyReserve(b.ctx, b.params(to)); !errors.Is(err, idemcrypt.ErrOpen) {
				t.Fatalf("moved to %+v: KeyReserve = %v; want ErrOpen", to, err)
			}
		}
		// A status changed in the store (it is kept in the clear) makes the
		// record's own ciphertext fail to open.
		rs, ok := b.store.(idemstore.Resealer)
		if !ok {
			return
		}
		changed := *stolen
		changed.Status = 200
		if err := rs.KeyReseal(b.ctx, &idemstore.ResealParams{Identity: b.id, Token: b.get(t, b.id).Token, Response: &changed}); err != nil {
			t.Fatal(err)
		}
		if r, err := enc.KeyGet(b.ctx, b.id); !errors.Is(err, idemcrypt.ErrOpen) {
			t.Fatalf("status changed: KeyGet = %+v, %v; want ErrOpen", r, err)
		}
	})

	t.Run("EarlierIncarnation", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		enc := idemcrypt.New(b.store, newKeyring(t, "k1"))
		b.completeWith(t, enc, b.id, secretResponse())
		saved := b.get(t, b.id).Response
		requireSealed(t, b.get(t, b.id), "k1")

		// The record is purged and the key used again at once, for another
		// request: same identity, same creation time, another fingerprint.
		if _, err := b.store.KeyPurge(b.ctx, &idemstore.PurgeParams{Identity: b.id}); err != nil {
			t.Fatal(err)
		}
		p := b.params(b.id)
		p.Fingerprint = otherFingerprint
		b.reserveNew(t, p)
		b.complete(t, b.id, p.Token, saved) // the answer saved earlier, planted
		if r, err := enc.KeyGet(b.ctx, b.id); !errors.Is(err, idemcrypt.ErrOpen) {
			t.Fatalf("planted on another fingerprint: KeyGet = %+v, %v; want ErrOpen", r, err)
		}
		if _, err := enc.KeyReserve(b.ctx, p); !errors.Is(err, idemcrypt.ErrOpen) {
			t.Fatalf("planted on another fingerprint: KeyReserve = %v; want ErrOpen", err)
		}

		// The record expires and the key is used again later for the same
		// request: same identity and fingerprint, another creation time.
		b.clock.Advance(testTTL + time.Second)
		p = b.params(b.id)
		b.reserveNew(t, p)
		b.complete(t, b.id, p.Token, saved)
		if r, err := enc.KeyGet(b.ctx, b.id); !errors.Is(err, idemcrypt.ErrOpen) {
			t.Fatalf("planted on a later record: KeyGet = %+v, %v; want ErrOpen", r, err)
		}

		// Its own answer, sealed for it, opens.
		b.clock.Advance(testTTL + time.Second)
		b.completeWith(t, enc, b.id, secretResponse())
		got, err := enc.KeyGet(b.ctx, b.id)
		if err != nil {
			t.Fatal(err)
		}
		requireResponse(t, got, secretResponse())
	})

	t.Run("Rotation", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if _, ok := b.store.(idemstore.Resealer); !ok {
			t.Skipf("%T does not implement idemstore.Resealer", b.store)
		}
		kr := sharedKeyrings(t)
		ids := make([]idemstore.Identity, 7)
		for i := range ids {
			ids[i] = idemstore.Identity{Scope: b.id.Scope, Endpoint: b.id.Endpoint, Key: fmt.Sprintf("%s-%02d", b.id.Key, i)}
			store := idemcrypt.New(b.store, kr.old)
			if i == 0 {
				store = b.store // one stored in the clear
			}
			b.completeWith(t, store, ids[i], secretResponse())
		}
		// One under a key nobody has any more: reported, left alone.
		lost := idemstore.Identity{Scope: b.id.Scope, Endpoint: b.id.Endpoint, Key: b.id.Key + "-zz-lost"}
		b.completeWith(t, idemcrypt.New(b.store, newKeyring(t, "retired")), lost, secretResponse())
		// One in progress: nothing to rotate.
		b.reserveNew(t, b.params(idemstore.Identity{Scope: b.id.Scope, Endpoint: b.id.Endpoint, Key: b.id.Key + "-held"}))

		// Stop after the first batch, as an interrupted rotation would,
		// then resume from its cursor.
		var steps []idemcrypt.RotateProgress
		ctx, cancel := context.WithCancel(b.ctx)
		defer cancel()
		cfg := &idemcrypt.RotateConfig{Batch: 3, Progress: func(p idemcrypt.RotateProgress) {
			steps = append(steps, p)
			cancel()
		}}
		first, err := idemcrypt.Rotate(ctx, b.store, kr.both, cfg)
		if !errors.Is(err, context.Canceled) || first.Scanned != 3 || first.Cursor == nil || first.Cursor.Key != ids[2].Key {
			t.Fatalf("first batch: %+v, %v; want 3 scanned, the cursor at %q and context.Canceled", first, err, ids[2].Key)
		}
		// Between the batches, a keyring with only the old key still opens
		// every record not yet rotated, and refuses the rotated ones by the
		// name of their key; the rotating keyring opens them all.
		for i, id := range ids {
			got, err := idemcrypt.New(b.store, kr.old).KeyGet(b.ctx, id)
			var ke *idemcrypt.KeyError
			switch {
			case i < 3 && (!errors.As(err, &ke) || ke.Name != "new" || !errors.Is(err, idemcrypt.ErrUnknownKey)):
				t.Fatalf("mid-rotation, the old keyring on rotated %+v: %v; want ErrUnknownKey naming \"new\"", id, err)
			case i >= 3 && err != nil:
				t.Fatalf("mid-rotation, the old keyring cannot open %+v: %v", id, err)
			case i >= 3:
				requireResponse(t, got, secretResponse())
			}
			if got, err = idemcrypt.New(b.store, kr.both).KeyGet(b.ctx, id); err != nil {
				t.Fatalf("mid-rotation, the rotating keyring cannot open %+v: %v", id, err)
			}
			requireResponse(t, got, secretResponse())
		}
		cfg.After = first.Cursor
		cfg.Progress = func(p idemcrypt.RotateProgress) { steps = append(steps, p) }
		rest, err := idemcrypt.Rotate(b.ctx, b.store, kr.both, cfg)
		if err != nil {
			t.Fatalf("Rotate: %v", err)
		}
		// The resumed run finishes the interrupted pass, then makes a whole
		// pass from the start to see that nothing is left.
		if total := first.Scanned + rest.Scanned; rest.Passes != 2 || total != 2*(len(ids)+1) {
			t.Fatalf("scanned %d + %d records in %d passes, want %d in 2", first.Scanned, rest.Scanned, rest.Passes, 2*(len(ids)+1))
		}
		if got := first.Resealed + rest.Resealed; got != len(ids) {
			t.Fatalf("resealed %d, want %d (%+v, %+v)", got, len(ids), first, rest)
		}
		if rest.Unopenable["retired"] != 1 || rest.Failed() != 1 {
			t.Fatalf("unopenable %v, want retired:1", rest.Unopenable)
		}
		for _, s := range steps {
			if s.Scanned == 0 {
				t.Fatalf("a progress report with nothing scanned: %+v", s)
			}
		}
		for _, id := range ids {
			requireSealed(t, b.get(t, id), "new")
			got, err := idemcrypt.New(b.store, kr.newOnly).KeyGet(b.ctx, id)
			if err != nil {
				t.Fatalf("after rotation the new key alone cannot open %+v: %v", id, err)
			}
			requireResponse(t, got, secretResponse())
		}
		requireSealed(t, b.get(t, lost), "retired")

		// Again: nothing left to do.
		again, err := idemcrypt.Rotate(b.ctx, b.store, kr.both, &idemcrypt.RotateConfig{Batch: 100})
		if err != nil || again.Passes != 1 || again.Resealed != 0 || again.Current != len(ids) || again.Failed() != 1 {
			t.Fatalf("second rotation: %+v, %v; want everything current", again, err)
		}
	})

	t.Run("RotationWithAnOldWriter", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if _, ok := b.store.(idemstore.Resealer); !ok {
			t.Skipf("%T does not implement idemstore.Resealer", b.store)
		}
		kr := sharedKeyrings(t)
		old := idemcrypt.New(b.store, kr.old)
		id := func(prefix string, i int) idemstore.Identity {
			return idemstore.Identity{Scope: b.id.Scope, Endpoint: b.id.Endpoint, Key: fmt.Sprintf("%s-%s-%02d", b.id.Key, prefix, i)}
		}
		var ids []idemstore.Identity
		for i := range 6 {
			ids = append(ids, id("m", i))
			b.completeWith(t, old, ids[i], secretResponse())
		}
		// A node still running with the old keys file seals new records
		// under the old key while the rotation runs: after each of the
		// first batches, one record whose identity sorts before the cursor,
		// which that pass has passed already.
		late := 0
		prog, err := idemcrypt.Rotate(b.ctx, b.store, kr.both, &idemcrypt.RotateConfig{Batch: 2, Progress: func(p idemcrypt.RotateProgress) {
			if late < 3 {
				ids = append(ids, id("a", late))
				b.completeWith(t, old, ids[len(ids)-1], secretResponse())
				late++
			}
		}})
		if err != nil {
			t.Fatalf("Rotate = %+v, %v", prog, err)
		}
		if prog.Passes < 2 || prog.Resealed != len(ids) {
			t.Fatalf("Rotate = %+v; want every one of %d records resealed, over more than one pass", prog, len(ids))
		}
		for _, id := range ids {
			requireSealed(t, b.get(t, id), "new")
		}

		// A writer that never stops: Rotate gives up after MaxPasses and
		// says why, instead of looping for ever.
		b.completeWith(t, old, id("b", 0), secretResponse())
		n := 1
		prog, err = idemcrypt.Rotate(b.ctx, b.store, kr.both, &idemcrypt.RotateConfig{Batch: 100, MaxPasses: 3, Progress: func(p idemcrypt.RotateProgress) {
			b.completeWith(t, old, id("b", n), secretResponse())
			n++
		}})
		if !errors.Is(err, idemcrypt.ErrRotationUnsettled) || prog.Passes != 3 {
			t.Fatalf("Rotate with a writer that never stops = %+v, %v; want ErrRotationUnsettled after 3 passes", prog, err)
		}

		// A writer running on its own while Rotate runs: once it has
		// stopped, Rotate goes on until a whole pass finds nothing left
		// under the old key.
		stop, stopped := make(chan struct{}), make(chan struct{})
		var written []idemstore.Identity
		var writeErr error
		first := make(chan struct{})
		go func() {
			defer close(stopped)
			defer func() {
				if len(written) == 0 {
					close(first)
				}
			}()
			for i := range 50 {
				select {
				case <-stop:
					return
				default:
				}
				p := b.params(id("c", i))
				if _, writeErr = old.KeyReserve(b.ctx, p); writeErr != nil {
					return
				}
				writeErr = old.KeyComplete(b.ctx, &idemstore.CompleteParams{Identity: p.Identity, Token: p.Token, Response: secretResponse()})
				if writeErr != nil {
					return
				}
				written = append(written, p.Identity)
				if i == 0 {
					close(first)
				}
			}
		}()
		<-first // the writer is at work when the rotation starts
		once := false
		prog, err = idemcrypt.Rotate(b.ctx, b.store, kr.both, &idemcrypt.RotateConfig{Batch: 4, MaxPasses: 100, Progress: func(p idemcrypt.RotateProgress) {
			if p.Passes >= 2 && !once {
				once = true
				close(stop)
				<-stopped
			}
		}})
		if !once {
			close(stop)
			<-stopped
		}
		if err != nil || writeErr != nil {
			t.Fatalf("Rotate with a concurrent writer = %+v, %v (writer: %v)", prog, err, writeErr)
		}
		if len(written) == 0 {
			t.Fatal("the writer wrote nothing")
		}
		for _, id := range written {
			requireSealed(t, b.get(t, id), "new")
		}
	})

	t.Run("Wrapped", func(t *testing.T) {
		t.Parallel()
		kr := newKeyring(t, "wrapped")
		wrapped := func(t *testing.T) *bundle {
			t.Helper()
			b := setup(t)
			b.store = idemcrypt.New(b.store, kr)
			return b
		}
		for name, run := range map[string]func(*testing.T, setupFunc){
			"Reserve": testReserve, "Complete": testComplete, "Fencing": testFencing,
			"Unknown": testUnknown, "Resolve": testResolve, "List": testList,
			"Transactional": testTransactional, "Wait": testWait,
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				run(t, wrapped)
			})
		}
	})
}

// keyrings sharing key material: old alone, new then old, new alone.
type rotationKeyrings struct {
	old, both, newOnly *idemcrypt.Keyring
}

func sharedKeyrings(t *testing.T) rotationKeyrings {
	t.Helper()
	oldSecret, newSecret := make([]byte, idemcrypt.KeySize), make([]byte, idemcrypt.KeySize)
	rand.Read(oldSecret)
	rand.Read(newSecret)
	mk := func(keys ...idemcrypt.Key) *idemcrypt.Keyring {
		kr, err := idemcrypt.NewKeyring(keys...)
		if err != nil {
			t.Fatal(err)
		}
		return kr
	}
	o, n := idemcrypt.Key{Name: "old", Secret: oldSecret}, idemcrypt.Key{Name: "new", Secret: newSecret}
	return rotationKeyrings{old: mk(o), both: mk(n, o), newOnly: mk(n)}
}

// WriteSealedResponses stores three completed responses on store through
// idemcrypt.New(store, kr) (by KeyComplete, by KeyResolve, and in a
// transaction when store is an idemstore.TxStore), each carrying a fresh
// random marker in a header value and in its body, checks that they replay,
// and returns the marker. A store's test then looks for the marker in the
// raw storage (the database file, the Redis values, the table): with a
// keyring it must not be there; with a nil kr the responses are stored in
// the clear, which shows that the search would find it.
func WriteSealedResponses(t *testing.T, store idemstore.Store, kr *idemcrypt.Keyring) string {
	t.Helper()
	marker := "MARKER-" + rand.Text()
	resp := func() *idemstore.Response {
		return &idemstore.Response{
			Status: 201,
			Header: map[string][]string{"Content-Type": {"application/json"}, "Location": {"/v1/things/" + marker}},
			Body:   []byte(`{"secret":"` + marker + `","pad":"` + strings.Repeat("x", 64) + `"}`),
		}
	}
	ctx := t.Context()
	enc := idemcrypt.New(store, kr)
	b := &bundle{store: enc, ctx: ctx}
	id := func(key string) idemstore.Identity {
		return idemstore.Identity{Scope: "tenant-" + marker[:12], Endpoint: "POST /v1/things", Key: key}
	}
	var ids []idemstore.Identity

	ids = append(ids, id("completed"))
	b.completeWith(t, enc, ids[0], resp())

	ids = append(ids, id("resolved"))
	p := b.params(ids[1])
	b.reserveNew(t, p)
	if err := enc.KeyMarkUnknown(ctx, &idemstore.FinishParams{Identity: ids[1], Token: p.Token}); err != nil {
		t.Fatal(err)
	}
	if err := enc.KeyResolve(ctx, &idemstore.ResolveParams{Identity: ids[1], Token: p.Token, To: idemstore.StateCompleted, Response: resp()}); err != nil {
		t.Fatal(err)
	}

	if ts, ok := enc.(idemstore.TxStore); ok {
		ids = append(ids, id("transactional"))
		p := b.params(ids[2])
		b.reserveNew(t, p)
		tx, err := ts.KeyBeginTx(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.KeyComplete(ctx, &idemstore.CompleteParams{Identity: ids[2], Token: p.Token, Response: resp()}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range ids {
		// Twice: a replay cache below fills on the first, answers the second.
		for range 2 {
			requireResponse(t, b.reserveExisting(t, b.params(id)), resp())
		}
		if kr == nil {
			continue
		}
		raw, err := store.KeyGet(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if name, ok := idemcrypt.SealedBy(raw.Response); !ok || name != kr.Primary() {
			t.Fatalf("record %q is not sealed under %q as stored", id.Key, kr.Primary())
		}
	}
	return marker
}

// NewTestKeyring returns a keyring of fresh random keys with the given
// names, the first sealing.
func NewTestKeyring(t testing.TB, names ...string) *idemcrypt.Keyring {
	t.Helper()
	keys := make([]idemcrypt.Key, len(names))
	for i, n := range names {
		keys[i] = idemcrypt.Key{Name: n, Secret: make([]byte, idemcrypt.KeySize)}
		rand.Read(keys[i].Secret)
	}
	kr, err := idemcrypt.NewKeyring(keys...)
	if err != nil {
		t.Fatal(err)
	}
	return kr
}
