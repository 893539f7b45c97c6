package idemsqlite

import (
	"reflect"
	"strconv"
	"strings"
	"testing"
)

func TestPositional(t *testing.T) {
	t.Parallel()
	got, args := positional("a = ?1 AND b = ?10 OR (c = ?1 AND d < ?2)")
	if want := "a = ? AND b = ? OR (c = ? AND d < ?)"; got != want {
		t.Errorf("positional text = %q, want %q", got, want)
	}
	if want := []int{0, 9, 0, 1}; !reflect.DeepEqual(args, want) {
		t.Errorf("positional args = %v, want %v", args, want)
	}
	p := &prepared{args: args}
	if got, want := p.bind([]any{"x", 2, 3, 4, 5, 6, 7, 8, 9, 10}), []any{"x", 10, "x", 2}; !reflect.DeepEqual(got, want) {
		t.Errorf("bind = %v, want %v", got, want)
	}
	// Every prepared statement keeps its parameters, each taking one of
	// the arguments the numbered text takes.
	for _, q := range append(writeStatements, readStatements...) {
		text, args := positional(q)
		if strings.Count(text, "?") != len(args) || len(args) == 0 {
			t.Errorf("%.40q: %d parameters, %d arguments", q, strings.Count(text, "?"), len(args))
		}
		for _, a := range args {
			if !strings.Contains(q, "?"+strconv.Itoa(a+1)) {
				t.Errorf("%.40q: argument %d is not a parameter", q, a+1)
			}
		}
	}
}
