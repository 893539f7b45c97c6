package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// No URL or connection string reaches stdout or stderr with its password,
// whatever its scheme or shape, from a flag or its IDEM_* variable.
func TestRunNeverPrintsPasswords(t *testing.T) {
	t.Parallel()
	const pw = "S3cretPW"
	tests := []struct {
		name string
		args []string
		env  map[string]string
	}{
		{"typo'd scheme", []string{"keys", "list", "--store", "postgress://postgres:" + pw + "@127.0.0.1:5432/x"}, nil},
		{"mysql", []string{"keys", "list", "--store", "mysql://root:" + pw + "@127.0.0.1:3306/x"}, nil},
		{"redis+sentinel", []string{"keys", "list", "--store", "redis+sentinel://:" + pw + "@127.0.0.1:1/0?master=m"}, nil},
		{"keyword DSN", []string{"keys", "list", "--store", "host=127.0.0.1 password=" + pw}, nil},
		{"IDEM_STORE", []string{"keys", "list"}, map[string]string{"IDEM_STORE": "postgress://postgres:" + pw + "@127.0.0.1:5432/x"}},
		{"IDEM_STORE keyword DSN", []string{"migrate", "status"}, map[string]string{"IDEM_STORE": "user=postgres password=" + pw}},
		{"bad port", []string{"keys", "list", "--store", "postgres://postgres:" + pw + "@127.0.0.1:badport/x"}, nil},
		{"bad query", []string{"maintain", "--once", "--store", "postgres://postgres:" + pw + "@127.0.0.1:1/x?sslmode=verify-full;"}, nil},
		{"cache bad port", []string{"proxy", "--upstream", "http://127.0.0.1:9", "--store", "memory:", "--listen", "127.0.0.1:0",
			"--cache", "redis://:" + pw + "@127.0.0.1:badport/1"}, nil},
		{"upstream userinfo", []string{"proxy", "--upstream", "http://admin:" + pw + "@127.0.0.1:9000"}, nil},
		{"IDEM_UPSTREAM userinfo", []string{"proxy"}, map[string]string{"IDEM_UPSTREAM": "http://admin:" + pw + "@127.0.0.1:9000"}},
		{"provider-url userinfo", []string{"payments", "--provider-url", "http://admin:" + pw + "@127.0.0.1:9000"}, nil},
		{"stray argument", []string{"proxy", "--upstream", "http://127.0.0.1:9", "postgres://u:" + pw + "@h/x"}, nil},
		{"tokens", []string{"payments", "--tokens", "acme=" + pw + ",bad"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			e := newTestEnv(tt.env)
			code := run(ctx, tt.args, e.env)
			if code == ExitOK {
				t.Errorf("exit code 0, want a failure\nstderr: %s", e.stderr)
			}
			out, errOut := e.stdout.String(), e.stderr.String()
			if strings.Contains(out+errOut, pw) {
				t.Errorf("the password is printed:\nstdout: %s\nstderr: %s", out, errOut)
			}
			if errOut == "" {
				t.Error("stderr is empty: the failure is not explained")
			}
		})
	}
}

// The same through the exported entry point, with the process's streams
// replaced by buffers.
func TestExportedRunNeverPrintsPasswords(t *testing.T) {
	t.Parallel()
	const pw = "S3cretPW"
	for _, args := range [][]string{
		{"keys", "list", "--store", "postgress://postgres:" + pw + "@127.0.0.1:5432/x"},
		{"migrate", "up", "--store", "host=127.0.0.1 password=" + pw},
		{"proxy", "--upstream", "http://admin:" + pw + "@127.0.0.1:9000"},
		{"proxy", "--upstream", "http://127.0.0.1:9", "--store", "memory:", "--listen", "127.0.0.1:0", "--cache", "redis://:" + pw + "@127.0.0.1:badport/1"},
		{"payments", "--provider-url", "http://admin:" + pw + "@127.0.0.1:9000"},
	} {
		var stdout, stderr bytes.Buffer
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		code := Run(ctx, args, &stdout, &stderr)
		cancel()
		if code == ExitOK || stderr.Len() == 0 {
			t.Errorf("idem %s: exit %d, stderr %q; want a failure explained", args[0], code, stderr.String())
		}
		if strings.Contains(stdout.String()+stderr.String(), pw) {
			t.Errorf("idem %s prints the password:\nstdout: %s\nstderr: %s", strings.Join(args[:2], " "), stdout.String(), stderr.String())
		}
	}
}
