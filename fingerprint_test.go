package idem

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	stdjson "encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/go-json-experiment/json/jsontext"
)

// The sample of RFC 8785, section 3.2.2, and its canonical form (3.2.3).
const (
	rfc8785Sample = `{
  "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}`
	rfc8785SampleCanonical = `{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}`

	// The property sorting example of RFC 8785, section 3.2.3.
	rfc8785Sorting = `{
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
}`
	rfc8785SortingCanonical = "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u0080\":\"Control\"," +
		"\"\u00f6\":\"Latin Small Letter O With Diaeresis\",\"\u20ac\":\"Euro Sign\"," +
		"\"\U0001F600\":\"Emoji: Grinning Face\",\"\ufb33\":\"Hebrew Letter Dalet With Dagesh\"}"
)

var canonicalizeTests = []struct {
	name, in, want string
}{
	{"rfc8785 sample", rfc8785Sample, rfc8785SampleCanonical},
	{"rfc8785 sorting", rfc8785Sorting, rfc8785SortingCanonical},
	{"1e+30", "1e+30", "1e+30"},
	{"1E30", "1E30", "1e+30"},
	{"4.50", "4.50", "4.5"},
	{"0.002", "0.002", "0.002"},
	{"2e-3", "2e-3", "0.002"},
	{"1e-7", "1e-7", "1e-7"},
	{"0.0000001", "0.0000001", "1e-7"},
	{"0.000001", "0.000001", "0.000001"},
	{"minus zero", "-0", "0"},
	{"minus zero float", "-0.0e10", "0"},
	{"333333333.33333329", "333333333.33333329", "333333333.3333333"},
	{"2^53", "9007199254740992", "9007199254740992"},
	{"2^53+1 rounds", "9007199254740993", "9007199254740992"},
	{"1e21", "1e21", "1e+21"},
	{"1e20", "1e20", "100000000000000000000"},
	{"integer spelled as float", "10.000", "10"},
	{"underflow", "1e-400", "0"},
	{"largest double", "1.7976931348623157e308", "1.7976931348623157e+308"},
	{"whitespace", " \t\r\n[ 1 , { \"b\" : 2 , \"a\" : [ ] } ]\n", `[1,{"a":[],"b":2}]`},
	{"nested sort", `{"b":{"d":1,"c":2},"a":[{"z":0,"y":1}]}`, `{"a":[{"y":1,"z":0}],"b":{"c":2,"d":1}}`},
	{"utf-16 order", `{"\ufb33":1,"\ud83d\ude00":2}`, "{\"\U0001F600\":2,\"\ufb33\":1}"},
	{"escapes minimal", `"\u0041\/\u001f\u007f\t\b\f"`, "\"A/\\u001f\x7f\\t\\b\\f\""},
	{"scalars", `[true,false,null,"",{},[]]`, `[true,false,null,"",{},[]]`},
}

// rfc8785Numbers is the number serialisation table of RFC 8785, appendix B:
// IEEE 754 bits and their canonical text.
var rfc8785Numbers = []struct {
	bits uint64
	want string
}{
	{0x0000000000000000, "0"},
	{0x8000000000000000, "0"},
	{0x0000000000000001, "5e-324"},
	{0x8000000000000001, "-5e-324"},
	{0x7fefffffffffffff, "1.7976931348623157e+308"},
	{0xffefffffffffffff, "-1.7976931348623157e+308"},
	{0x4340000000000000, "9007199254740992"},
	{0xc340000000000000, "-9007199254740992"},
	{0x4430000000000000, "295147905179352830000"},
	{0x44b52d02c7e14af5, "9.999999999999997e+22"},
	{0x44b52d02c7e14af6, "1e+23"},
	{0x44b52d02c7e14af7, "1.0000000000000001e+23"},
	{0x444b1ae4d6e2ef4e, "999999999999999700000"},
	{0x444b1ae4d6e2ef4f, "999999999999999900000"},
	{0x444b1ae4d6e2ef50, "1e+21"},
	{0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"},
	{0x3eb0c6f7a0b5ed8d, "0.000001"},
	{0x41b3de4355555553, "333333333.3333332"},
	{0x41b3de4355555554, "333333333.33333325"},
	{0x41b3de4355555555, "333333333.3333333"},
	{0x41b3de4355555556, "333333333.3333334"},
	{0x41b3de4355555557, "333333333.33333343"},
	{0xbecbf647612f3696, "-0.0000033333333333333333"},
	{0x43143ff3c1cb0959, "1424953923781206.2"},
}

func TestCanonicalize(t *testing.T) {
	t.Parallel()
	for _, tt := range canonicalizeTests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			in := []byte(tt.in)
			got, err := Canonicalize(in)
			if err != nil {
				t.Fatalf("Canonicalize(%s): %v", tt.in, err)
			}
			if string(got) != tt.want {
				t.Errorf("Canonicalize(%s)\n got %s\nwant %s", tt.in, got, tt.want)
			}
			if string(in) != tt.in {
				t.Errorf("Canonicalize modified its input to %s", in)
			}
		})
	}
}

func TestCanonicalizeNumbers(t *testing.T) {
	t.Parallel()
	for _, tt := range rfc8785Numbers {
		f := math.Float64frombits(tt.bits)
		// Spell each number in three ways that parse to the same double.
		for _, in := range []string{
			strconv.FormatFloat(f, 'e', -1, 64),
			strconv.FormatFloat(f, 'g', 17, 64),
			strconv.FormatFloat(f, 'E', 25, 64),
		} {
			got, err := Canonicalize([]byte(in))
			if err != nil || string(got) != tt.want {
				t.Errorf("%#016x: Canonicalize(%s) = %s, %v; want %s", tt.bits, in, got, err, tt.want)
			}
		}
	}
}

func TestCanonicalizeErrors(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		"",
		" ",
		"nul",
		"[1,]",
		`{"a":1,}`,
		"1 2",
		`{"a":1}{}`,
		`{"a":1,"a":2}`,
		`{"a":{"b":1,"b":2}}`,
		`{"a":1,"\u0061":2}`,
		"\"a\xffb\"",
		`"\ud800"`,
		`"\udc00\ud800"`,
		"1e400",
		"[-1e400]",
		`{"x":[1,2,1e999]}`,
		"NaN",
		"Infinity",
		"01",
		"+1",
		".5",
		"'a'",
		"\ufeff{}",
		`{"a" 1}`,
		`["a\u00"]`,
		"\"a\tb\"",
	} {
		got, err := Canonicalize([]byte(in))
		if err == nil {
			t.Errorf("Canonicalize(%q) = %q, want an error", in, got)
		}
	}
	_, err := Canonicalize([]byte("1e400"))
	if !errors.Is(err, errNumberRange) {
		t.Errorf("Canonicalize(1e400) error %v, want errNumberRange", err)
	}
}

func TestIsJSONMediaType(t *testing.T) {
	t.Parallel()
	for ct, want := range map[string]bool{
		"application/json":                        true,
		"Application/JSON":                        true,
		"application/json; charset=utf-8":         true,
		" application/json ;charset=UTF-8":        true,
		"application/problem+json":                true,
		"application/vnd.api+JSON; ext=bulk":      true,
		"application/merge-patch+json":            true,
		"text/plain":                              false,
		"":                                        false,
		"json":                                    false,
		"application/jsonx":                       false,
		"application/+json":                       false,
		"/json":                                   false,
		"application/x-www-form-urlencoded":       false,
		"multipart/form-data; boundary=\"+json\"": false,
		"application/json-seq":                    false,
	} {
		if got := isJSONMediaType(ct); got != want {
			t.Errorf("isJSONMediaType(%q) = %v, want %v", ct, got, want)
		}
	}
}

// fp fingerprints a POST to /v1/payments with the given query and JSON body.
func fp(query, body string) string {
	return Fingerprint("POST", "POST /v1/payments", query, "application/json", []byte(body), FingerprintConfig{})
}

func TestFingerprintJSONEquivalence(t *testing.T) {
	t.Parallel()
	base := fp("", `{"amount":1000,"currency":"eur","meta":{"a":1,"b":[1.5,2]}}`)
	for _, body := range []string{
		`{"currency":"eur","amount":1000,"meta":{"b":[1.5,2],"a":1}}`,
		" {\n  \"amount\" : 1e3 ,\n  \"currency\" : \"eur\",\n  \"meta\" : { \"a\" : 1.0, \"b\" : [ 15e-1, 2.00 ] }\n}\n",
		`{"amount":1000.0,"currency":"\u0065ur","meta":{"a":10E-1,"b":[1.50,2]}}`,
	} {
		if got := fp("", body); got != base {
			t.Errorf("fingerprint of %s differs from the canonical body's", body)
		}
	}
	for _, ct := range []string{"application/json; charset=utf-8", "APPLICATION/JSON", "application/vnd.idem+json"} {
		got := Fingerprint("POST", "POST /v1/payments", "", ct, []byte(`{"currency":"eur","meta":{"a":1,"b":[1.5,2]},"amount":1000}`), FingerprintConfig{})
		if got != base {
			t.Errorf("content type %q: fingerprint differs", ct)
		}
	}
}

func TestFingerprintDifferences(t *testing.T) {
	t.Parallel()
	const body = `{"amount":1000}`
	base := Fingerprint("POST", "POST /v1/payments", "a=1", "application/json", []byte(body), FingerprintConfig{})
	if len(base) != 64 {
		t.Fatalf("fingerprint %q is not 64 hex digits", base)
	}
	if _, err := hex.DecodeString(base); err != nil {
		t.Fatalf("fingerprint %q is not hex: %v", base, err)
	}
	for name, got := range map[string]string{
		"method":       Fingerprint("PATCH", "POST /v1/payments", "a=1", "application/json", []byte(body), FingerprintConfig{}),
		"endpoint":     Fingerprint("POST", "POST /v1/refunds", "a=1", "application/json", []byte(body), FingerprintConfig{}),
		"query value":  Fingerprint("POST", "POST /v1/payments", "a=2", "application/json", []byte(body), FingerprintConfig{}),
		"query name":   Fingerprint("POST", "POST /v1/payments", "b=1", "application/json", []byte(body), FingerprintConfig{}),
		"extra param":  Fingerprint("POST", "POST /v1/payments", "a=1&a=1", "application/json", []byte(body), FingerprintConfig{}),
		"no query":     Fingerprint("POST", "POST /v1/payments", "", "application/json", []byte(body), FingerprintConfig{}),
		"body value":   Fingerprint("POST", "POST /v1/payments", "a=1", "application/json", []byte(`{"amount":1001}`), FingerprintConfig{}),
		"body type":    Fingerprint("POST", "POST /v1/payments", "a=1", "application/json", []byte(`{"amount":"1000"}`), FingerprintConfig{}),
		"extra member": Fingerprint("POST", "POST /v1/payments", "a=1", "application/json", []byte(`{"amount":1000,"x":null}`), FingerprintConfig{}),
		"no body":      Fingerprint("POST", "POST /v1/payments", "a=1", "application/json", nil, FingerprintConfig{}),
		"as text":      Fingerprint("POST", "POST /v1/payments", "a=1", "text/plain", []byte(body), FingerprintConfig{}),
	} {
		if got == base {
			t.Errorf("changing the %s does not change the fingerprint", name)
		}
	}
}

func TestFingerprintQueryOrder(t *testing.T) {
	t.Parallel()
	base := fp("a=1&b=2&b=3&c=", `{}`)
	for _, q := range []string{"b=3&c=&a=1&b=2", "c&b=2&a=1&b=3", "b=2&a=%31&b=3&c=&", "c=&b=3&b=2&a=1"} {
		if got := fp(q, `{}`); got != base {
			t.Errorf("query %q: fingerprint differs from a=1&b=2&b=3&c=", q)
		}
	}
	// An unparsable query is hashed as sent: stable, and not equal to any
	// query that parses.
	bad := fp("a=%zz&b=1", `{}`)
	if bad != fp("a=%zz&b=1", `{}`) {
		t.Error("fingerprint of an unparsable query is not stable")
	}
	if bad == fp("b=1&a=%zz", `{}`) {
		t.Error("an unparsable query is reordered")
	}
	if bad == fp("a=%25zz&b=1", `{}`) || bad == fp("b=1", `{}`) {
		t.Error("an unparsable query collides with a parsed one")
	}
	if fp("a=1;b=2", `{}`) == fp("a=1&b=2", `{}`) {
		t.Error("a query with a semicolon is parsed")
	}
}

// TestFingerprintLengthPrefix checks that no byte can move from one field to
// its neighbour without changing the fingerprint.
func TestFingerprintLengthPrefix(t *testing.T) {
	t.Parallel()
	type req struct{ method, endpoint, query, body string }
	pairs := [][2]req{
		{{"ab", "c", "", ""}, {"a", "bc", "", ""}},
		{{"POST", "/a", "b=1", ""}, {"POST", "/ab=1", "", ""}},
		{{"POST", "/x", "a=b", ""}, {"POST", "/x", "a", "b"}},
		{{"POST", "/x", "", "\x00\x00\x00"}, {"POST", "/x\x00\x00\x00", "", ""}},
		{{"POST", "/x", "a=1&b=2", ""}, {"POST", "/x", "a=1%26b%3D2", ""}},
		{{"POST", "/x", "ab=c", ""}, {"POST", "/x", "a=bc", ""}},
	}
	for _, p := range pairs {
		x := Fingerprint(p[0].method, p[0].endpoint, p[0].query, "text/plain", []byte(p[0].body), FingerprintConfig{})
		y := Fingerprint(p[1].method, p[1].endpoint, p[1].query, "text/plain", []byte(p[1].body), FingerprintConfig{})
		if x == y {
			t.Errorf("%q and %q have the same fingerprint", p[0], p[1])
		}
	}
}

// TestFingerprintLayout recomputes a fingerprint from the documented layout,
// so a change of the scheme shows up here (and must bump the version tag).
func TestFingerprintLayout(t *testing.T) {
	t.Parallel()
	field := func(b []byte, s string) []byte {
		b = binary.BigEndian.AppendUint64(b, uint64(len(s)))
		return append(b, s...)
	}
	var pairs []byte
	pairs = field(field(pairs, "a"), "1")
	pairs = field(field(pairs, "b"), "2")
	pairs = field(field(pairs, "b"), "3")
	var b []byte
	b = field(b, "idem-fingerprint-v1")
	b = field(b, "POST")
	b = field(b, "POST /v1/payments")
	b = field(b, "query")
	b = field(b, string(pairs))
	b = field(b, "json")
	b = field(b, `{"a":1,"b":[2]}`)
	sum := sha256.Sum256(b)
	want := hex.EncodeToString(sum[:])
	if got := fp("b=3&a=1&b=2", `{ "b": [2.0], "a": 1 }`); got != want {
		t.Errorf("fingerprint = %s, want %s", got, want)
	}
}

func TestFingerprintInvalidJSON(t *testing.T) {
	t.Parallel()
	for _, body := range []string{`{"a":1`, `{"a":1,"a":2}`, "\"\xff\"", `[1e400]`, "not json"} {
		got := fp("", body)
		if got != fp("", body) {
			t.Errorf("%q: fingerprint not stable", body)
		}
		if raw := Fingerprint("POST", "POST /v1/payments", "", "text/plain", []byte(body), FingerprintConfig{}); got == raw {
			t.Errorf("%q: invalid JSON has the same fingerprint as raw text", body)
		}
	}
	// Raw, so spelling matters again.
	if fp("", `{"a":1,"a":2}`) == fp("", `{"a":2,"a":1}`) {
		t.Error("invalid JSON bodies with other bytes share a fingerprint")
	}
	if fp("", `{"a":1`) == fp("", `{ "a":1`) {
		t.Error("invalid JSON is normalised")
	}
}

func TestFingerprintRaw(t *testing.T) {
	t.Parallel()
	for _, ct := range []string{"text/plain", "", "application/x-www-form-urlencoded", "application/octet-stream"} {
		x := Fingerprint("POST", "/upload", "", ct, []byte(`{"a":1}`), FingerprintConfig{})
		y := Fingerprint("POST", "/upload", "", ct, []byte(`{ "a":1}`), FingerprintConfig{})
		if x == y {
			t.Errorf("%q: raw bodies that differ share a fingerprint", ct)
		}
		if x != Fingerprint("POST", "/upload", "", ct, []byte(`{"a":1}`), FingerprintConfig{}) {
			t.Errorf("%q: fingerprint not stable", ct)
		}
	}
	// The empty body does not depend on the media type.
	if Fingerprint("POST", "/x", "", "text/plain", nil, FingerprintConfig{}) != Fingerprint("POST", "/x", "", "application/json", []byte{}, FingerprintConfig{}) {
		t.Error("empty bodies of two media types differ")
	}
	// Fingerprint leaves the body alone.
	body := []byte(`{ "b": 1, "a": 2 }`)
	Fingerprint("POST", "/x", "", "application/json", body, FingerprintConfig{Exclude: []string{"a"}})
	if string(body) != `{ "b": 1, "a": 2 }` {
		t.Errorf("Fingerprint modified the body to %s", body)
	}
}

func TestFingerprintIncludeExclude(t *testing.T) {
	t.Parallel()
	const body = `{"amount":1000,"client_ts":"2026-01-01T00:00:00Z","currency":"eur","nested":{"client_ts":1}}`
	fc := func(include, exclude []string) FingerprintConfig {
		return FingerprintConfig{Include: include, Exclude: exclude}
	}
	f := func(body string, c FingerprintConfig) string {
		return Fingerprint("POST", "/p", "", "application/json", []byte(body), c)
	}
	ex := fc(nil, []string{"client_ts"})
	if f(body, ex) != f(`{"nested":{"client_ts":1},"currency":"eur","amount":1000,"client_ts":"later"}`, ex) {
		t.Error("Exclude: the excluded member still counts")
	}
	if f(body, ex) != f(`{"amount":1000,"currency":"eur","nested":{"client_ts":1}}`, ex) {
		t.Error("Exclude: absence of the excluded member counts")
	}
	if f(body, ex) == f(`{"amount":1000,"client_ts":"x","currency":"eur","nested":{"client_ts":2}}`, ex) {
		t.Error("Exclude: a nested member of the same name was dropped")
	}
	if f(body, ex) == f(`{"amount":1001,"client_ts":"x","currency":"eur","nested":{"client_ts":1}}`, ex) {
		t.Error("Exclude: a kept member no longer counts")
	}
	in := fc([]string{"amount", "currency"}, nil)
	if f(body, in) != f(`{"currency":"eur","amount":1e3,"other":[1,2,3]}`, in) {
		t.Error("Include: members not included still count")
	}
	if f(body, in) == f(`{"currency":"usd","amount":1000}`, in) {
		t.Error("Include: an included member no longer counts")
	}
	both := fc([]string{"amount", "currency"}, []string{"currency"})
	if f(body, both) != f(`{"amount":1000}`, FingerprintConfig{}) {
		t.Error("Include and Exclude: want the included members less the excluded ones")
	}
	// The narrowed body is what a body of just those members hashes to.
	if f(body, in) != f(`{"amount":1000,"currency":"eur"}`, FingerprintConfig{}) {
		t.Error("Include: narrowed body differs from the body of those members")
	}
	// Names are compared unescaped.
	if f(`{"a\u0062":1,"c":2}`, fc(nil, []string{"ab"})) != f(`{"c":2}`, FingerprintConfig{}) {
		t.Error("Exclude: an escaped member name was not matched")
	}
	// A non-object body is left whole.
	for _, b := range []string{`[{"client_ts":1}]`, `"client_ts"`, `12`, `null`} {
		if f(b, ex) != f(b, FingerprintConfig{}) || f(b, in) != f(b, FingerprintConfig{}) {
			t.Errorf("%s: a non-object body was narrowed", b)
		}
	}
	if f(`{}`, ex) != f(`{}`, FingerprintConfig{}) || f(`{"client_ts":1}`, ex) != f(`{}`, FingerprintConfig{}) {
		t.Error("Exclude: an object left empty differs from {}")
	}
}

func TestFilterCanonical(t *testing.T) {
	t.Parallel()
	canon, err := Canonicalize([]byte(`{"z":[1,{"a":"}"}],"b\"":"x,y","c":{"d":[]},"e":null,"f":-1.5e-7,"g":true}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		fc   FingerprintConfig
		want string
	}{
		{FingerprintConfig{Exclude: []string{"z"}}, `{"b\"":"x,y","c":{"d":[]},"e":null,"f":-1.5e-7,"g":true}`},
		{FingerprintConfig{Exclude: []string{`b"`, "g"}}, `{"c":{"d":[]},"e":null,"f":-1.5e-7,"z":[1,{"a":"}"}]}`},
		{FingerprintConfig{Include: []string{"f", "z", "missing"}}, `{"f":-1.5e-7,"z":[1,{"a":"}"}]}`},
		{FingerprintConfig{Include: []string{"missing"}}, `{}`},
		{FingerprintConfig{Include: []string{"e"}}, `{"e":null}`},
	} {
		got := tt.fc.filter(bytes.Clone(canon))
		if string(got) != tt.want {
			t.Errorf("%+v: got %s, want %s", tt.fc, got, tt.want)
		}
	}
}

// TestFingerprintConcurrent shares the pooled state between goroutines; run
// with -race.
func TestFingerprintConcurrent(t *testing.T) {
	t.Parallel()
	bodies := []string{`{"a":1,"b":[1,2,3]}`, `{"b":[1,2,3],"a":1.0}`, `[1,2]`, `{"x":"` + strings.Repeat("y", 100<<10) + `"}`}
	want := make([]string, len(bodies))
	for i, b := range bodies {
		want[i] = fp("q=1", b)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				k := (g + i) % len(bodies)
				if got := fp("q=1", bodies[k]); got != want[k] {
					errs <- fmt.Errorf("body %d: got %s, want %s", k, got, want[k])
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// raceEnabled reports whether the test binary was built with -race.
func raceEnabled() bool {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range info.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

// benchBody is a typical payment request of about 200 bytes.
const benchBody = `{"amount": 1999, "currency": "eur", "customer": "cus_9s6XKzkNRiz8i3",
 "description": "Order #10042", "metadata": {"order_id": "10042", "channel": "web"},
 "capture": true, "payment_method": "pm_1NGl4r2eZvKYlo2C"}`

func TestFingerprintAllocs(t *testing.T) {
	if raceEnabled() {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	body := []byte(benchBody)
	fc := FingerprintConfig{Exclude: []string{"description"}}
	fp := func() { Fingerprint("POST", "POST /v1/payments", "", "application/json", body, fc) }
	fp()
	// One allocation is the returned string; jsontext may take a few more.
	if n := testing.AllocsPerRun(100, fp); n > 4 {
		t.Errorf("Fingerprint of a JSON body allocates %v times, want at most 4", n)
	}
	raw := func() { Fingerprint("POST", "POST /v1/payments", "", "text/plain", body, FingerprintConfig{}) }
	if n := testing.AllocsPerRun(100, raw); n > 1 {
		t.Errorf("Fingerprint of a raw body allocates %v times, want 1", n)
	}
}

func BenchmarkFingerprintJSON(b *testing.B) {
	body := []byte(benchBody)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		Fingerprint("POST", "POST /v1/payments", "", "application/json", body, FingerprintConfig{})
	}
}

func BenchmarkFingerprintJSONExclude(b *testing.B) {
	body := []byte(benchBody)
	fc := FingerprintConfig{Exclude: []string{"description"}}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		Fingerprint("POST", "POST /v1/payments", "expand=customer&limit=10", "application/json", body, fc)
	}
}

func BenchmarkFingerprintRaw(b *testing.B) {
	body := []byte(benchBody)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		Fingerprint("POST", "POST /v1/payments", "", "text/plain", body, FingerprintConfig{})
	}
}

func FuzzCanonicalize(f *testing.F) {
	for _, tt := range canonicalizeTests {
		f.Add([]byte(tt.in))
	}
	for _, tt := range rfc8785Numbers {
		f.Add([]byte(strconv.FormatFloat(math.Float64frombits(tt.bits), 'g', 17, 64)))
	}
	f.Add([]byte(benchBody))
	f.Add([]byte(`{"a":1,"a":2}`))
	f.Add([]byte(`[1e400]`))
	f.Fuzz(func(t *testing.T, in []byte) {
		orig := bytes.Clone(in)
		out, err := Canonicalize(in)
		if !bytes.Equal(in, orig) {
			t.Fatal("Canonicalize modified its input")
		}
		if err != nil {
			return
		}
		if !jsontext.Value(out).IsValid() {
			t.Fatalf("canonical form %q is not valid JSON", out)
		}
		again, err := Canonicalize(out)
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("canonicalising %q again gives %q, %v", out, again, err)
		}
		var x, y any
		if err := stdjson.Unmarshal(in, &x); err != nil {
			t.Fatalf("input %q accepted by Canonicalize but not by encoding/json: %v", in, err)
		}
		if err := stdjson.Unmarshal(out, &y); err != nil {
			t.Fatalf("canonical form %q does not parse: %v", out, err)
		}
		if !reflect.DeepEqual(x, y) {
			t.Fatalf("canonical form %q means %v, input %q means %v", out, y, in, x)
		}
		// Narrowing an object keeps it canonical and drops exactly the
		// named members.
		if obj, ok := x.(map[string]any); ok && len(obj) > 0 {
			var first string
			for name := range obj {
				first = name
				break
			}
			narrowed := FingerprintConfig{Exclude: []string{first}}.filter(bytes.Clone(out))
			var z map[string]any
			if err := stdjson.Unmarshal(narrowed, &z); err != nil {
				t.Fatalf("narrowed %q to invalid %q: %v", out, narrowed, err)
			}
			delete(obj, first)
			if !reflect.DeepEqual(map[string]any(obj), z) {
				t.Fatalf("excluding %q from %q gives %q", first, out, narrowed)
			}
			if again, err := Canonicalize(narrowed); err != nil || !bytes.Equal(again, narrowed) {
				t.Fatalf("narrowed form %q is not canonical", narrowed)
			}
			kept := FingerprintConfig{Include: []string{first}}.filter(bytes.Clone(out))
			if !jsontext.Value(kept).IsValid() {
				t.Fatalf("including %q from %q gives invalid %q", first, out, kept)
			}
		}
	})
}

func ExampleCanonicalize() {
	out, err := Canonicalize([]byte(`{"b": [4.50, 1E30, -0], "a": "\u20ac"}`))
	fmt.Println(string(out), err)
	// Output: {"a":"€","b":[4.5,1e+30,0]} <nil>
}

func ExampleFingerprint() {
	fc := FingerprintConfig{Exclude: []string{"client_ts"}}
	a := Fingerprint("POST", "POST /v1/payments", "b=2&a=1", "application/json",
		[]byte(`{"amount": 1000, "currency": "eur", "client_ts": 1}`), fc)
	b := Fingerprint("POST", "POST /v1/payments", "a=1&b=2", "application/json; charset=utf-8",
		[]byte(`{"currency":"eur","amount":1e3,"client_ts":2}`), fc)
	fmt.Println(a == b)
	// Output: true
}
