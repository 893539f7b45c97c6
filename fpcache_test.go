package idem

import (
	"fmt"
	"strings"
	"testing"
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
	for round := range 3 { // the first round fills the cache, the others hit it
		for _, v := range variants {
			want := Fingerprint(v.method, v.endpoint, v.query, v.ctype, body, fc)
			if got := c.fingerprint(v.method, v.endpoint, v.query, v.ctype, v.scope, body, fc); got != want {
				t.Fatalf("round %d, %+v: cached fingerprint %s, want %s", round, v, got, want)
			}
		}
	}
	// The cache answers from the body's bytes, not from a copy the caller
	// may change afterwards.
	mutable := []byte(`{"a":1}`)
	first := c.fingerprint("POST", "POST /x", "", "application/json", "", mutable, FingerprintConfig{})
	copy(mutable, `{"a":2}`)
	if got, want := c.fingerprint("POST", "POST /x", "", "application/json", "", mutable, FingerprintConfig{}),
		Fingerprint("POST", "POST /x", "", "application/json", mutable, FingerprintConfig{}); got != want || got == first {
		t.Fatalf("after changing the body: %s, want %s (not %s)", got, want, first)
	}
}

func TestFingerprintCacheBounded(t *testing.T) {
	t.Parallel()
	var c fpCache
	for i := range 3 * fpCacheSlots {
		body := []byte(fmt.Sprintf(`{"order":%d}`, i))
		want := Fingerprint("POST", "POST /v1/payments", "", "application/json", body, FingerprintConfig{})
		if got := c.fingerprint("POST", "POST /v1/payments", "", "application/json", "", body, FingerprintConfig{}); got != want {
			t.Fatalf("body %d: %s, want %s", i, got, want)
		}
	}
	// A body over the size bound is fingerprinted, never kept.
	big := []byte(`{"pad":"` + strings.Repeat("x", fpCacheMaxBody) + `"}`)
	c.fingerprint("POST", "POST /v1/payments", "", "application/json", "", big, FingerprintConfig{})
	for i := range c.slots {
		if s := &c.slots[i]; cap(s.body) > fpCacheMaxBody || len(s.body) > 0 && s.body[len(s.body)-1] != '}' {
			t.Fatalf("slot %d holds %d bytes (capacity %d): %.40q", i, len(s.body), cap(s.body), s.body)
		}
	}
}

// TestFingerprintCacheCollision sends bodies that share a slot in turns:
// each evicts the other, and every answer is still its own fingerprint.
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
		for _, body := range same {
			want := Fingerprint("POST", "POST /v1/payments", "", "application/json", body, FingerprintConfig{})
			if got := c.fingerprint("POST", "POST /v1/payments", "", "application/json", "", body, FingerprintConfig{}); got != want {
				t.Fatalf("round %d, %s: %s, want %s", round, body, got, want)
			}
			if string(slot.body) != string(body) {
				t.Fatalf("round %d: the slot holds %s after %s", round, slot.body, body)
			}
		}
	}
}

func BenchmarkFingerprintCached(b *testing.B) {
	var c fpCache
	body := []byte(benchBody)
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
