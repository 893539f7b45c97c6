package sqlfile

import (
	"maps"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		src     string
		want    map[string]string
		wantErr string
	}{
		{"empty", "", map[string]string{}, ""},
		{"header only", "-- Statements of the store.\n-- More words.\n", map[string]string{}, ""},
		{
			"statements",
			"-- header\n\n-- name: a\n-- what a does\nSELECT 1;\n\n-- name: b \nSELECT\n    2;\n",
			map[string]string{"a": "-- what a does\nSELECT 1;", "b": "SELECT\n    2;"},
			"",
		},
		{"no final newline", "-- name: a\nSELECT 1;", map[string]string{"a": "SELECT 1;"}, ""},
		{"empty statement", "-- name: a\n-- name: b\nSELECT 2;\n", map[string]string{"a": "", "b": "SELECT 2;"}, ""},
		{"crlf", "-- name: a\r\nSELECT 1;\r\n", map[string]string{"a": "SELECT 1;"}, ""},
		{"not a name line", "-- name: a\n--name: b\nSELECT 1;\n", map[string]string{"a": "--name: b\nSELECT 1;"}, ""},
		{"twice", "-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n", nil, `"a" occurs twice`},
		{"twice at the end", "-- name: a\n-- name: b\n-- name: a\n", nil, `"a" occurs twice`},
		{"no name", "-- name: a\nSELECT 1;\n-- name:  \nSELECT 2;\n", nil, "without a name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := Parse(tt.src)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Parse = %q, %v; want an error containing %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || !maps.Equal(got, tt.want) {
				t.Fatalf("Parse = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestMustParse(t *testing.T) {
	t.Parallel()
	if got := MustParse("ok.sql", "-- name: a\nSELECT 1;\n"); got["a"] != "SELECT 1;" {
		t.Fatalf("MustParse = %q", got)
	}
	defer func() {
		r := recover()
		if msg, _ := r.(string); !strings.HasPrefix(msg, "bad.sql: ") {
			t.Fatalf("MustParse panicked with %v, want a message naming bad.sql", r)
		}
	}()
	MustParse("bad.sql", "-- name: a\n-- name: a\n")
	t.Fatal("MustParse of a bad file returned")
}
