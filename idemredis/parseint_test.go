package idemredis

import (
	"strconv"
	"testing"
)

// parseIntCases are the numbers a record holds and the strings around the
// fast path's edges: signs, 18 and 19 digits, overflow, not numbers.
var parseIntCases = []string{
	"0", "1", "-1", "201", "1764259771123456", "-1764259771123456",
	"999999999999999999", "-999999999999999999", "1000000000000000000",
	"9223372036854775807", "9223372036854775808", "-9223372036854775808",
	"-9223372036854775809", "", "-", "+1", "+", "1a", "a1", " 1", "1 ",
	"1234567/", "1234567:", "12345678:2345678", "/2345678", "123456789012345\x00", "12345678901234567",
	"1_000", "0x10", "007", "-0", "١",
}

// parseInt and atoi answer as strconv.ParseInt and strconv.Atoi do, errors
// included.
func TestParseIntAsStrconv(t *testing.T) {
	t.Parallel()
	for _, s := range parseIntCases {
		checkParseInt(t, s)
	}
}

func FuzzParseInt(f *testing.F) {
	for _, s := range parseIntCases {
		f.Add(s)
	}
	f.Fuzz(checkParseInt)
}

func checkParseInt(t *testing.T, s string) {
	got, err := parseInt(s)
	want, wantErr := strconv.ParseInt(s, 10, 64)
	if got != want || errString(err) != errString(wantErr) {
		t.Errorf("parseInt(%q) = %d, %v; strconv.ParseInt: %d, %v", s, got, err, want, wantErr)
	}
	goti, err := atoi(s)
	wanti, wantErr := strconv.Atoi(s)
	if goti != wanti || errString(err) != errString(wantErr) {
		t.Errorf("atoi(%q) = %d, %v; strconv.Atoi: %d, %v", s, goti, err, wanti, wantErr)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
