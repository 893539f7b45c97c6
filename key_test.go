package idem

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

type parseKeyTest struct {
	name   string
	values []string
	want   string // the key, when err is nil
	err    error  // the exact reason, when the key is refused
}

var parseKeyTests = []parseKeyTest{
	{name: "bare", values: []string{"abc"}, want: "abc"},
	{name: "quoted", values: []string{`"abc"`}, want: "abc"},
	{name: "uuid bare", values: []string{"8e03978e-40d5-43e8-bc93-6894a57f9324"}, want: "8e03978e-40d5-43e8-bc93-6894a57f9324"},
	{name: "uuid quoted", values: []string{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`}, want: "8e03978e-40d5-43e8-bc93-6894a57f9324"},
	{name: "one char bare", values: []string{"a"}, want: "a"},
	{name: "one char quoted", values: []string{`"a"`}, want: "a"},
	{name: "255 bare", values: []string{strings.Repeat("k", 255)}, want: strings.Repeat("k", 255)},
	{name: "255 quoted", values: []string{`"` + strings.Repeat("k", 255) + `"`}, want: strings.Repeat("k", 255)},
	{name: "255 with escapes", values: []string{`"` + strings.Repeat(`\"`, 255) + `"`}, want: strings.Repeat(`"`, 255)},
	{name: "OWS trimmed bare", values: []string{" \tabc\t "}, want: "abc"},
	{name: "OWS trimmed quoted", values: []string{" \t\"abc\"\t "}, want: "abc"},
	{name: "escaped quote", values: []string{`"a\"b"`}, want: `a"b`},
	{name: "escaped backslash", values: []string{`"a\\b"`}, want: `a\b`},
	{name: "only escapes", values: []string{`"\\\""`}, want: `\"`},
	{name: "escape at start and end", values: []string{`"\"x\""`}, want: `"x"`},
	{name: "space inside quotes", values: []string{`"a b"`}, want: "a b"},
	{name: "comma inside quotes", values: []string{`"a,b"`}, want: "a,b"},
	{name: "semicolon inside quotes", values: []string{`"a;b=1"`}, want: "a;b=1"},
	{name: "visible punctuation bare", values: []string{"!#$%&'()*+-./:<=>?@[]^_`{|}~"}, want: "!#$%&'()*+-./:<=>?@[]^_`{|}~"},
	{name: "backslash bare is literal", values: []string{`a\b`}, want: `a\b`},
	{name: "quote at end of bare", values: []string{`abc"`}, err: errKeyQuote},

	{name: "no field line", values: nil, err: errKeyNoField},
	{name: "two field lines", values: []string{"abc", "abc"}, err: errKeyManyFields},
	{name: "two field lines one empty", values: []string{"abc", ""}, err: errKeyManyFields},
	{name: "empty", values: []string{""}, err: errKeyEmpty},
	{name: "only whitespace", values: []string{" \t "}, err: errKeyEmpty},
	{name: "empty quoted", values: []string{`""`}, err: errKeyEmpty},
	{name: "256 bare", values: []string{strings.Repeat("k", 256)}, err: errKeyTooLong},
	{name: "256 quoted", values: []string{`"` + strings.Repeat("k", 256) + `"`}, err: errKeyTooLong},
	{name: "256 with escapes", values: []string{`"` + strings.Repeat(`\\`, 256) + `"`}, err: errKeyTooLong},
	{name: "list bare", values: []string{"a,b"}, err: errKeyList},
	{name: "list bare with space", values: []string{"a, b"}, err: errKeyList},
	{name: "list trailing comma", values: []string{"abc,"}, err: errKeyList},
	{name: "list quoted", values: []string{`"a","b"`}, err: errKeyList},
	{name: "list quoted with OWS", values: []string{`"a" , "b"`}, err: errKeyAfterQuote},
	{name: "parameters quoted", values: []string{`"abc";a=1`}, err: errKeyParams},
	{name: "parameters bare", values: []string{"abc;a=1"}, err: errKeyParams},
	{name: "text after quote", values: []string{`"abc"def`}, err: errKeyAfterQuote},
	{name: "second string after quote", values: []string{`"abc""def"`}, err: errKeyAfterQuote},
	{name: "space inside bare", values: []string{"a b"}, err: errKeyWhitespace},
	{name: "tab inside bare", values: []string{"a\tb"}, err: errKeyWhitespace},
	{name: "non-ASCII bare", values: []string{"cl\u00e9"}, err: errKeyNonASCII},
	{name: "non-ASCII quoted", values: []string{"\"cl\u00e9\""}, err: errKeyNonASCII},
	{name: "invalid UTF-8", values: []string{"a\xffb"}, err: errKeyNonASCII},
	{name: "control bare", values: []string{"a\x01b"}, err: errKeyControl},
	{name: "NUL bare", values: []string{"a\x00b"}, err: errKeyControl},
	{name: "DEL bare", values: []string{"a\x7fb"}, err: errKeyControl},
	{name: "newline bare", values: []string{"a\nb"}, err: errKeyControl},
	{name: "control quoted", values: []string{"\"a\x01b\""}, err: errKeyControl},
	{name: "tab quoted", values: []string{"\"a\tb\""}, err: errKeyControl},
	{name: "DEL quoted", values: []string{"\"a\x7fb\""}, err: errKeyControl},
	{name: "bad escape", values: []string{`"a\nb"`}, err: errKeyEscape},
	{name: "unicode escape", values: []string{`"a\u0041"`}, err: errKeyEscape},
	{name: "escaped space", values: []string{`"a\ b"`}, err: errKeyEscape},
	{name: "unterminated", values: []string{`"abc`}, err: errKeyUnterminated},
	{name: "lone quote", values: []string{`"`}, err: errKeyUnterminated},
	{name: "unterminated after escape", values: []string{`"abc\"`}, err: errKeyUnterminated},
	{name: "trailing backslash", values: []string{`"abc\`}, err: errKeyUnterminated},
	{name: "byte sequence", values: []string{":YWJj:"}, want: ":YWJj:"},
}

func TestParseKey(t *testing.T) {
	t.Parallel()
	for _, tt := range parseKeyTests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseKey(tt.values)
			if tt.err != nil {
				if err != tt.err {
					t.Fatalf("ParseKey(%q) = %q, %v; want error %v", tt.values, got, err, tt.err)
				}
				if !errors.Is(err, ErrKeyInvalid) {
					t.Errorf("error %v does not wrap ErrKeyInvalid", err)
				}
				if got != "" {
					t.Errorf("ParseKey returned key %q with an error", got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseKey(%q) = %q, %v; want %q", tt.values, got, err, tt.want)
			}
		})
	}
}

// TestParseKeyFormsAgree checks that the bare and the sf-string form of a key
// address the same key.
func TestParseKeyFormsAgree(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"a", "abc", "8e03978e-40d5-43e8-bc93-6894a57f9324", `a\b`, strings.Repeat("z", 255)} {
		bare, err := ParseKey([]string{key})
		if err != nil {
			t.Fatalf("bare %q: %v", key, err)
		}
		quoted, err := ParseKey([]string{quoteKey(key)})
		if err != nil {
			t.Fatalf("quoted %q: %v", key, err)
		}
		if bare != key || quoted != key {
			t.Errorf("key %q: bare form gives %q, quoted form %q", key, bare, quoted)
		}
	}
}

// TestParseKeyErrorHidesKey checks that no refusal message repeats the key.
func TestParseKeyErrorHidesKey(t *testing.T) {
	t.Parallel()
	const secret = "s3cr3tK3y"
	for _, v := range []string{
		secret + ",x", secret + ";a=1", `"` + secret + `";a=1`, `"` + secret + `\n"`, `"` + secret,
		secret + " x", secret + "\x01", secret + "\u00e9", strings.Repeat(secret, 40),
		`"` + secret + `"x`,
	} {
		_, err := ParseKey([]string{v})
		if err == nil {
			t.Fatalf("ParseKey(%q) accepted", v)
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("error for %q repeats the key: %v", v, err)
		}
	}
}

func TestParseKeyAllocs(t *testing.T) {
	values := []string{"8e03978e-40d5-43e8-bc93-6894a57f9324"}
	quoted := []string{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`}
	bad := []string{"a,b"}
	for name, vals := range map[string][]string{"bare": values, "quoted": quoted, "refused": bad} {
		if n := testing.AllocsPerRun(100, func() { _, _ = ParseKey(vals) }); n != 0 {
			t.Errorf("%s: ParseKey allocates %v times, want 0", name, n)
		}
	}
}

// quoteKey returns key as an RFC 8941 sf-string.
func quoteKey(key string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`)
	return `"` + r.Replace(key) + `"`
}

func FuzzParseKey(f *testing.F) {
	for _, tt := range parseKeyTests {
		if len(tt.values) == 1 {
			f.Add(tt.values[0])
		}
	}
	f.Fuzz(func(t *testing.T, v string) {
		key, err := ParseKey([]string{v})
		if err != nil {
			if !errors.Is(err, ErrKeyInvalid) {
				t.Fatalf("error %v does not wrap ErrKeyInvalid", err)
			}
			if key != "" {
				t.Fatalf("key %q returned with error %v", key, err)
			}
			if len(v) >= 4 && strings.Contains(err.Error(), v) {
				t.Fatalf("error %q repeats the input", err)
			}
			return
		}
		if len(key) < 1 || len(key) > MaxKeyLength {
			t.Fatalf("accepted key of length %d", len(key))
		}
		for i := 0; i < len(key); i++ {
			if c := key[i]; c < 0x20 || c > 0x7e {
				t.Fatalf("accepted key with byte %#x", c)
			}
		}
		if !strings.ContainsAny(key, " \",;") {
			if got, err := ParseKey([]string{key}); err != nil || got != key {
				t.Fatalf("bare form of %q parses to %q, %v", key, got, err)
			}
		}
		if got, err := ParseKey([]string{quoteKey(key)}); err != nil || got != key {
			t.Fatalf("quoted form of %q parses to %q, %v", key, got, err)
		}
		if _, err := ParseKey([]string{v, v}); err == nil {
			t.Fatalf("two field lines accepted")
		}
	})
}

func BenchmarkParseKey(b *testing.B) {
	for _, bm := range []struct {
		name  string
		value string
	}{
		{"bare", "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		{"quoted", `"8e03978e-40d5-43e8-bc93-6894a57f9324"`},
		{"escaped", `"8e03978e-40d5-43e8-bc93-6894a57f9324\\"`},
	} {
		values := []string{bm.value}
		b.Run(bm.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ParseKey(values); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func ExampleParseKey() {
	for _, v := range []string{`"8e03978e-40d5"`, `8e03978e-40d5`, `"a\"b"`, `"a";p=1`, `a,b`} {
		key, err := ParseKey([]string{v})
		fmt.Printf("%-16s %q %v\n", v, key, err)
	}
	// Output:
	// "8e03978e-40d5"  "8e03978e-40d5" <nil>
	// 8e03978e-40d5    "8e03978e-40d5" <nil>
	// "a\"b"           "a\"b" <nil>
	// "a";p=1          "" invalid Idempotency-Key: parameters are not allowed
	// a,b              "" invalid Idempotency-Key: a list is not allowed
}
