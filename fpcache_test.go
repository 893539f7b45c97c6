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
	for i := range 5 * fpCacheEntries {
		body := []byte(fmt.Sprintf(`{"order":%d}`, i))
		want := Fingerprint("POST", "POST /v1/payments", "", "application/json", body, FingerprintConfig{})
		if got := c.fingerprint("POST", "POST /v1/payments", "", "application/json", "", body, FingerprintConfig{}); got != want {
			t.Fatalf("body %d: %s, want %s", i, got, want)
		}
		if n := len(c.cur) + len(c.old); n > fpCacheEntries {
			t.Fatalf("after %d bodies the cache holds %d entries, more than %d", i+1, n, fpCacheEntries)
		}
	}
	// A body over the size bound is fingerprinted, never kept.
	big := []byte(`{"pad":"` + strings.Repeat("x", fpCacheMaxBody) + `"}`)
	before := len(c.cur) + len(c.old)
	c.fingerprint("POST", "POST /v1/payments", "", "application/json", "", big, FingerprintConfig{})
	if _, ok := c.cur[string(big)]; ok || len(c.cur)+len(c.old) > before {
		t.Fatal("a body over fpCacheMaxBody was cached")
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
