package idem

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-dev/idem/idemmem"
)

func TestFingerprintCache(t *testing.T) {
	t.Parallel()
	var c fpCache
	fc := FingerprintConfig{Exclude: []string{"note"}}
	body := []byte(`{"b":2,"a":1,"note":"x"}`)
	type req struct{ method, endpoint, query, ctype, scope string }
	base := req{"POST", "POST /v1/payments", "", "application/json", "tenant-a"}
	// Every input of the fingerprint, changed one at a time, with the same
	// body: the cache must never answer one with another's fingerprint.
	variants := []req{
		base,
		{"PUT", base.endpoint, base.query, base.ctype, base.scope},
		{base.method, "POST /v1/refunds", base.query, base.ctype, base.scope},
		{base.method, base.endpoint, "expand=customer", base.ctype, base.scope},
		{base.method, base.endpoint, base.query, "text/plain", base.scope},
		{base.method, base.endpoint, base.query, "application/merge-patch+json", base.scope},
		{base.method, base.endpoint, base.query, base.ctype, "tenant-b"},
	}
	for i, v := range variants {
		want := Fingerprint(v.method, v.endpoint, v.query, v.ctype, body, fc)
		// Not remembered yet: computed, a miss.
		if got, hit := c.fingerprint(v.method, v.endpoint, v.query, v.ctype, v.scope, body, fc); got != want || hit {
			t.Fatalf("%+v before remember: %s (hit %v), want %s, a miss", v, got, hit, want)
		}
		c.remember(v.method, v.endpoint, v.query, v.ctype, v.scope, body, want)
		// Remembered: a hit for this variant (but text/plain, never
		// cached); every other is answered its own fingerprint (a hit only
		// where the cache's check cannot tell them apart: both media types
		// are JSON, which is all the fingerprint takes of them).
		if got, hit := c.fingerprint(v.method, v.endpoint, v.query, v.ctype, v.scope, body, fc); got != want || hit != (v.ctype != "text/plain") {
			t.Fatalf("%+v after remember: %s (hit %v), want %s", v, got, hit, want)
		}
		for j, o := range variants {
			if j == i {
				continue
			}
			got, hit := c.fingerprint(o.method, o.endpoint, o.query, o.ctype, o.scope, body, fc)
			if got != Fingerprint(o.method, o.endpoint, o.query, o.ctype, body, fc) || hit && o.ctype == v.ctype {
				t.Fatalf("%+v remembered, %+v: %s (hit %v)", v, o, got, hit)
			}
		}
	}
	// The cache keeps a copy of the body, not the caller's slice.
	mutable := []byte(`{"a":1}`)
	first := Fingerprint("POST", "POST /x", "", "application/json", mutable, FingerprintConfig{})
	c.remember("POST", "POST /x", "", "application/json", "", mutable, first)
	copy(mutable, `{"a":2}`)
	if got, hit := c.fingerprint("POST", "POST /x", "", "application/json", "", mutable, FingerprintConfig{}); hit || got == first {
		t.Fatalf("after changing the body: %s (hit %v), the old fingerprint %s", got, hit, first)
	}
}

func TestFingerprintCacheBounded(t *testing.T) {
	t.Parallel()
	var c fpCache
	for i := range 3 * fpCacheSlots {
		body := []byte(fmt.Sprintf(`{"order":%d}`, i))
		want := Fingerprint("POST", "POST /v1/payments", "", "application/json", body, FingerprintConfig{})
		c.remember("POST", "POST /v1/payments", "", "application/json", "", body, want)
		if got, hit := c.fingerprint("POST", "POST /v1/payments", "", "application/json", "", body, FingerprintConfig{}); got != want || !hit {
			t.Fatalf("body %d: %s (hit %v), want %s from the cache", i, got, hit, want)
		}
	}
	// A body over the size bound is never kept.
	big := []byte(`{"pad":"` + strings.Repeat("x", fpCacheMaxBody) + `"}`)
	c.remember("POST", "POST /v1/payments", "", "application/json", "", big, "fp")
	for i := range c.slots {
		if s := c.slots[i].Load(); s != nil && (cap(s.body) > fpCacheMaxBody || len(s.body) > 0 && s.body[len(s.body)-1] != '}') {
			t.Fatalf("slot %d holds %d bytes (capacity %d): %.40q", i, len(s.body), cap(s.body), s.body)
		}
	}
}

// TestFingerprintCacheCollision remembers bodies that share a slot in
// turns: each evicts the other, and every answer is still its own
// fingerprint.
func TestFingerprintCacheCollision(t *testing.T) {
	t.Parallel()
	var c fpCache
	first := []byte(`{"order":0}`)
	slot := c.slot(first)
	same := [][]byte{first}
	for i := 1; len(same) < 3; i++ {
		if body := []byte(fmt.Sprintf(`{"order":%d}`, i)); c.slot(body) == slot {
			same = append(same, body)
		}
	}
	for round := range 4 {
		for i, body := range same {
			want := Fingerprint("POST", "POST /v1/payments", "", "application/json", body, FingerprintConfig{})
			got, hit := c.fingerprint("POST", "POST /v1/payments", "", "application/json", "", body, FingerprintConfig{})
			if got != want || hit != (len(same) == 1) {
				t.Fatalf("round %d, %s: %s (hit %v), want %s, a miss (body %d evicted it)", round, body, got, hit, want, (i+len(same)-1)%len(same))
			}
			c.remember("POST", "POST /v1/payments", "", "application/json", "", body, want)
			if s := slot.Load(); string(s.body) != string(body) {
				t.Fatalf("round %d: the slot holds %s after %s", round, s.body, body)
			}
		}
	}
}

// TestFingerprintCacheRemembersRetries checks the middleware's use of the
// cache: a new request is not remembered, its retry is, and the retry after
// that is answered from the cache.
func TestFingerprintCacheRemembersRetries(t *testing.T) {
	t.Parallel()
	m := newMiddleware(idemmem.New(nil), nil)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	body := `{"amount":100}`
	send := func(key string) {
		r := httptest.NewRequest("POST", "/v1/payments", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		m.serve(w, r, h)
		if w.Code != http.StatusCreated {
			t.Fatalf("key %s: %d %s", key, w.Code, w.Body)
		}
	}
	remembered := func() bool {
		_, hit := m.fps.fingerprint("POST", "POST /v1/payments", "", "application/json", "", []byte(body), FingerprintConfig{})
		return hit
	}
	send("k1")
	if remembered() {
		t.Fatal("a new request was remembered")
	}
	send("k2") // the same body with another key is another new request
	if remembered() {
		t.Fatal("a new request with a body seen before was remembered")
	}
	send("k1") // a retry (a replay)
	if !remembered() {
		t.Fatal("a retry was not remembered")
	}
	send("k1")
	if !remembered() {
		t.Fatal("the cache forgot")
	}
}

func BenchmarkFingerprintCached(b *testing.B) {
	var c fpCache
	body := []byte(benchBody)
	c.remember("POST", "POST /v1/payments", "", "application/json", "", body,
		Fingerprint("POST", "POST /v1/payments", "", "application/json", body, FingerprintConfig{}))
	b.ReportAllocs()
	for b.Loop() {
		c.fingerprint("POST", "POST /v1/payments", "", "application/json", "", body, FingerprintConfig{})
	}
}

func BenchmarkFingerprintCacheMiss(b *testing.B) {
	var c fpCache
	bodies := make([][]byte, 4096)
	for i := range bodies {
		bodies[i] = []byte(strings.ReplaceAll(benchBody, "10042", fmt.Sprintf("%05d", i)))
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		c.fingerprint("POST", "POST /v1/payments", "", "application/json", "", bodies[i%len(bodies)], FingerprintConfig{})
		i++
	}
}
