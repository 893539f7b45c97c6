package headerjson

import (
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"unsafe"
)

// A Cache decodes as Decode does, errors included, the first time and
// from its slots after.
func TestCacheDecodesAsJSON(t *testing.T) {
	t.Parallel()
	c := NewCache()
	for range 2 {
		for _, s := range headerSeeds {
			want := make(http.Header)
			wantErr := json.Unmarshal([]byte(s), &want)
			got, err := c.Decode(s)
			if fmt.Sprint(err) != fmt.Sprint(wantErr) {
				t.Fatalf("Decode(%q) error = %v, want %v", s, err, wantErr)
			}
			if err == nil && !reflect.DeepEqual(got, want) {
				t.Fatalf("Decode(%q) = %#v, want %#v", s, got, want)
			}
		}
	}
}

// The second decoding of a JSON is the header of the first, and holds no
// memory of the first caller's: changing the bytes its JSON was in
// changes nothing cached.
func TestCacheSharesOwnCopy(t *testing.T) {
	t.Parallel()
	c := NewCache()
	b := []byte(`{"Content-Type":["application/json"]}`)
	first, err := c.Decode(unsafe.String(&b[0], len(b)))
	if err != nil {
		t.Fatal(err)
	}
	copy(b, strings.Repeat("x", len(b)))
	again, err := c.Decode(`{"Content-Type":["application/json"]}`)
	if err != nil {
		t.Fatal(err)
	}
	want := http.Header{"Content-Type": {"application/json"}}
	if !reflect.DeepEqual(first, want) || !reflect.DeepEqual(again, want) {
		t.Fatalf("decoded %v and %v, want %v", first, again, want)
	}
	if reflect.ValueOf(first).UnsafePointer() != reflect.ValueOf(again).UnsafePointer() {
		t.Error("the second decoding is not the cached header")
	}
	long := `{"A":["` + strings.Repeat("a", cacheMax) + `"]}`
	h1, _ := c.Decode(long)
	h2, _ := c.Decode(long)
	if reflect.ValueOf(h1).UnsafePointer() == reflect.ValueOf(h2).UnsafePointer() {
		t.Error("a JSON longer than cacheMax was cached")
	}
}

// Many goroutines decoding JSONs that share slots get each its own
// header, as Decode would give it.
func TestCacheConcurrent(t *testing.T) {
	t.Parallel()
	c := NewCache()
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			for i := range 500 {
				v := fmt.Sprint((g + i) % 200)
				h, err := c.Decode(`{"Etag":["` + v + `"]}`)
				if err != nil || len(h) != 1 || len(h["Etag"]) != 1 || h["Etag"][0] != v {
					t.Errorf("decoded %v, %v; want Etag %s", h, err, v)
					return
				}
			}
		})
	}
	wg.Wait()
}

func BenchmarkCacheDecode(b *testing.B) {
	c := NewCache()
	s := `{"Content-Type":["application/json"]}`
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Decode(s); err != nil {
			b.Fatal(err)
		}
	}
}
