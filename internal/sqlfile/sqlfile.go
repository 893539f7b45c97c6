// Package sqlfile reads .sql files of named statements: each statement
// starts with a "-- name: X" line and runs to the next one. Text before the
// first name line (a file's header comment) belongs to no statement.
package sqlfile

import (
	"fmt"
	"strings"
)

// Parse splits src at its "-- name: X" lines and returns the statements by
// name, each trimmed of surrounding space. It reports a name that occurs
// twice or names nothing.
func Parse(src string) (map[string]string, error) {
	out := make(map[string]string)
	var name string
	var b strings.Builder
	flush := func() error {
		defer b.Reset()
		if name == "" {
			return nil
		}
		if _, dup := out[name]; dup {
			return fmt.Errorf("statement %q occurs twice", name)
		}
		out[name] = strings.TrimSpace(b.String())
		return nil
	}
	for line := range strings.Lines(src) {
		n, ok := strings.CutPrefix(line, "-- name: ")
		if !ok {
			b.WriteString(line)
			continue
		}
		if err := flush(); err != nil {
			return nil, err
		}
		if name = strings.TrimSpace(n); name == "" {
			return nil, fmt.Errorf("a %q line without a name", strings.TrimSpace(line))
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return out, nil
}

// MustParse is Parse for files embedded in the binary: it panics on an
// error, naming the file.
func MustParse(file, src string) map[string]string {
	m, err := Parse(src)
	if err != nil {
		panic(fmt.Sprintf("%s: %v", file, err))
	}
	return m
}
