package headerjson

import (
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"testing"
)

// checkHeader compares Decode with json.Unmarshal into a new http.Header.
func checkHeader(t *testing.T, s string) {
	t.Helper()
	want := make(http.Header)
	wantErr := json.Unmarshal([]byte(s), &want)
	got, err := Decode(s)
	if fmt.Sprint(err) != fmt.Sprint(wantErr) {
		t.Fatalf("Decode(%q) error = %v, want %v", s, err, wantErr)
	}
	if err == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("Decode(%q) = %#v, want %#v", s, got, want)
	}
}

var headerSeeds = []string{
	`{}`, `{"A":[]}`, `{"A":["b"]}`, `{"A":["b","c"],"D":["e"]}`, `{"":[""]}`,
	`{"Content-Type":["application/json"],"Location":["/v1/payments/pay_123"]}`,
	`{"A":null}`, `{"A":["\u003c"]}`, `{"A":["b\"c"]}`, `{"A":["é"]}`, `{"A":["\xff"]}`,
	`{"A":["b"],"A":["c"]}`, `{"A":["b"],}`, `{"A":["b",]}`, `{"A":[,]}`, `{,}`, `{"A"}`,
	`{"A":}`, `{"A":[}`, `{"A":["b"]`, `{"A":"b"}`, `{"A":[1]}`, ` {"A":["b"]}`,
	`{"A":["b"]} `, `{"A" :["b"]}`, `{"A":["b"]}x`, `[]`, `null`, ` null`, `"x"`, `{`, `}`, ``,
	`{"A":["b"]}{}`, `{"A":[""]}`, `{"a b":["<&>"]}`, `{"A":["\t"]}`,
	` { "A" : [ "b" , "c" ] , "D" : [ ] } `, "{\t\"A\":\n[\"b\"]\r}", `{"A": ["b"], "C": ["d", "e"]}`, `{ }`, `{"A":[ ]}`,
	"{\"A\":[\"b\"]}\v", `{"A":["b"] ,}`, `{"A":["b",  ]}`,
}

func TestDecodeHeaderMatchesJSON(t *testing.T) {
	for _, s := range headerSeeds {
		checkHeader(t, s)
	}
}

// TestDecodeHeaderFast checks that what the stores write for common headers
// takes the fast path, and what it must not decode does not.
func TestDecodeHeaderFast(t *testing.T) {
	for _, h := range []http.Header{
		{},
		{"Content-Type": {"application/json"}, "Location": {"/v1/payments/pay_123"}},
		{"Set-Cookie": {"a=1; Path=/", "b=2"}, "X-Empty": {}, "X-Blank": {""}},
	} {
		b, err := json.Marshal(h)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := decodeFast(string(b))
		if !ok || !reflect.DeepEqual(got, h) {
			t.Errorf("decodeFast(%s) = %#v, %v; want %#v, true", b, got, ok, h)
		}
	}
	// PostgreSQL's jsonb output.
	if h, ok := decodeFast(`{"Link": ["<a>", "<b>"], "Content-Type": ["application/json"]}`); !ok || len(h) != 2 {
		t.Errorf("decodeFast of jsonb output = %#v, %v; want 2 names, true", h, ok)
	}
	for _, s := range []string{`{"A":null}`, `{"A":["\u003c"]}`, `{"A":["é"]}`, `{"A":["b"],}`, `{"A" ["b"]}`, `{"A":["b"] "B":[]}`} {
		if h, ok := decodeFast(s); ok {
			t.Errorf("decodeFast(%q) = %#v, true; want false", s, h)
		}
	}
}

func FuzzDecodeHeader(f *testing.F) {
	for _, s := range headerSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		checkHeader(t, s)
	})
}

// FuzzDecodeHeaderMarshal decodes what json.Marshal writes for a header
// built from the input.
func FuzzDecodeHeaderMarshal(f *testing.F) {
	f.Add("Content-Type", "application/json", "Location", "/x", 2)
	f.Add("A", "<é>", "", "\x00", 0)
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string, n int) {
		h := http.Header{k1: {v1}, k2: make([]string, 0, 2)}
		for range n & 3 {
			h[k2] = append(h[k2], v2)
		}
		b, err := json.Marshal(h)
		if err != nil {
			t.Fatal(err)
		}
		checkHeader(t, string(b))
	})
}

// checkEncode compares Encode with json.Marshal.
func checkEncode(t *testing.T, h http.Header) {
	t.Helper()
	want, wantErr := json.Marshal(h)
	got, err := Encode(h)
	if fmt.Sprint(err) != fmt.Sprint(wantErr) || string(got) != string(want) {
		t.Fatalf("Encode(%#v) = %s, %v; want %s, %v", h, got, err, want, wantErr)
	}
}

func TestEncodeMatchesJSON(t *testing.T) {
	for _, h := range []http.Header{
		nil, {}, {"A": nil}, {"A": {}}, {"A": {""}}, {"": {"b"}},
		{"Content-Type": {"application/json"}, "Location": {"/v1/payments/pay_123"}, "Link": {"<a>", "b"}},
		{"B": {"1"}, "A": {"2", "3"}, "C": {"x&y"}}, {"A": {"é"}}, {"A": {"\x00"}}, {"A": {`"`}}, {"A": {`\`}},
		{"A": {"\xff"}}, {"A": {"\u2028"}},
	} {
		checkEncode(t, h)
	}
	if _, ok := encodeFast(http.Header{"Content-Type": {"application/json"}}); !ok {
		t.Error("a plain header did not take the fast path")
	}
}

func FuzzEncodeHeader(f *testing.F) {
	f.Add("Content-Type", "application/json", "Location", "/x", 2)
	f.Add("A", "<é>", "", "\x00", 0)
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string, n int) {
		h := http.Header{k1: {v1}}
		if n&4 == 0 {
			h[k2] = make([]string, 0, 2)
			for range n & 3 {
				h[k2] = append(h[k2], v2)
			}
		}
		checkEncode(t, h)
		b, err := Encode(h)
		if err != nil {
			t.Fatal(err)
		}
		checkHeader(t, string(b))
	})
}
