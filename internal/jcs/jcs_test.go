package jcs

import (
	"bytes"
	"strings"
	"testing"

	"github.com/go-json-experiment/json/jsontext"
)

// canonical is the full canonicaliser the fast path must agree with.
func canonical(src []byte) ([]byte, error) {
	v := jsontext.Value(bytes.Clone(src))
	err := v.Canonicalize()
	return v, err
}

var appendTests = []struct {
	in, want string // want "" when the text is outside the subset
}{
	{`{"customer_id":"cus_bench","amount_cents":1999,"currency":"EUR"}`, `{"amount_cents":1999,"currency":"EUR","customer_id":"cus_bench"}`},
	{" { \"b\" : [ 1 , 2 , { \"d\":null, \"c\":true } ] ,\n\t\"a\":false }\r\n", `{"a":false,"b":[1,2,{"c":true,"d":null}]}`},
	{`{}`, `{}`},
	{`[]`, `[]`},
	{`[{}]`, `[{}]`},
	{`"x"`, `"x"`},
	{`0`, `0`},
	{`-7`, `-7`},
	{`123456789012345`, `123456789012345`},
	{`{"a ":1,"a":2,"a!":3}`, `{"a":2,"a ":1,"a!":3}`},
	{`{"b":{"z":1,"y":2},"a":{"x":[{"q":1,"p":2}]}}`, `{"a":{"x":[{"p":2,"q":1}]},"b":{"y":2,"z":1}}`},
	{`{"name":"Zoë ☃ 😀"}`, `{"name":"Zoë ☃ 😀"}`},
	{"\"del\x7f\"", "\"del\x7f\""},
	// Outside the subset: the full canonicaliser decides.
	{`1.5`, ""},
	{`1e3`, ""},
	{`-0`, ""},
	{`1234567890123456`, ""},
	{`"a\"b"`, ""},
	{`"a\u0062"`, ""},
	{`{"é":1}`, ""},
	{`{"a":1,"a":2}`, ""},
	{`{"b":1,"a":2,"b":3}`, ""},
	{"\"a\xffb\"", ""},
	{"\"a\tb\"", ""},
	{`01`, ""},
	{`[1,]`, ""},
	{`{"a":1,}`, ""},
	{`1 2`, ""},
	{``, ""},
	{`tru`, ""},
	{`nulll`, ""},
	{`{"a" 1}`, ""},
	{strings.Repeat("[", 65) + strings.Repeat("]", 65), ""},
}

func TestAppend(t *testing.T) {
	t.Parallel()
	for _, tt := range appendTests {
		got, ok := Append([]byte("prefix"), []byte(tt.in))
		switch {
		case tt.want == "" && ok:
			t.Errorf("Append(%q) = %q, want it left to the full canonicaliser", tt.in, got)
		case tt.want == "" && string(got) != "prefix":
			t.Errorf("Append(%q) refused but changed dst to %q", tt.in, got)
		case tt.want != "" && (!ok || string(got) != "prefix"+tt.want):
			t.Errorf("Append(%q) = %q, %v; want %q", tt.in, got, ok, tt.want)
		}
		if tt.want != "" {
			if full, err := canonical([]byte(tt.in)); err != nil || string(full) != tt.want {
				t.Errorf("the table disagrees with jsontext on %q: %q, %v", tt.in, full, err)
			}
		}
	}
}

// Every text the fast path accepts canonicalises to the same bytes with
// jsontext; the fast path never accepts what jsontext refuses.
func FuzzAppend(f *testing.F) {
	for _, tt := range appendTests {
		f.Add([]byte(tt.in))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		orig := bytes.Clone(in)
		got, ok := Append(nil, in)
		if !bytes.Equal(in, orig) {
			t.Fatal("Append modified its input")
		}
		if !ok {
			return
		}
		want, err := canonical(in)
		if err != nil {
			t.Fatalf("Append accepted %q, which jsontext refuses: %v", in, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("Append(%q) = %q, jsontext gives %q", in, got, want)
		}
	})
}

func BenchmarkAppend(b *testing.B) {
	src := []byte(appendTests[0].in)
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			buf, _ = Append(buf[:0], src)
		}
	})
	b.Run("jsontext", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			v := jsontext.Value(append(buf[:0], src...))
			v.Canonicalize()
			buf = v
		}
	})
}
