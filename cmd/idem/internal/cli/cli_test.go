package cli

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe for a server's goroutines and the test,
// which can wait for a text to be written.
type syncBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	written chan struct{} // closed and replaced at every write
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.written != nil {
		close(b.written)
		b.written = nil
	}
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitFor reports whether s is written within timeout.
func (b *syncBuffer) waitFor(s string, timeout time.Duration) bool {
	deadline := time.After(timeout)
	for {
		b.mu.Lock()
		found := strings.Contains(b.buf.String(), s)
		if b.written == nil {
			b.written = make(chan struct{})
		}
		written := b.written
		b.mu.Unlock()
		if found {
			return true
		}
		select {
		case <-written:
		case <-deadline:
			return false
		}
	}
}

// testEnv is an env whose environment variables are vars.
type testEnv struct {
	*env
	stdout, stderr *syncBuffer
}

func newTestEnv(vars map[string]string) *testEnv {
	out, errOut := &syncBuffer{}, &syncBuffer{}
	return &testEnv{
		env: &env{
			stdout: out,
			stderr: errOut,
			lookupEnv: func(name string) (string, bool) {
				v, ok := vars[name]
				return v, ok
			},
			logger:       slog.New(slog.NewTextHandler(errOut, nil)),
			drainTimeout: 5 * time.Second,
		},
		stdout: out,
		stderr: errOut,
	}
}

func TestRun(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		args       []string
		env        map[string]string
		wantCode   int
		wantStdout string // substring; "" means stdout must be empty
		wantStderr string // substring; "" means stderr must be empty
	}{
		{name: "no command", args: nil, wantCode: ExitUsage, wantStderr: "Commands:\n  proxy"},
		{name: "-h", args: []string{"-h"}, wantCode: ExitOK, wantStdout: "Usage: idem COMMAND"},
		{name: "--help", args: []string{"--help"}, wantCode: ExitOK, wantStdout: "Usage: idem COMMAND"},
		{name: "help", args: []string{"help"}, wantCode: ExitOK, wantStdout: "Commands:"},
		{name: "help proxy", args: []string{"help", "proxy"}, wantCode: ExitOK, wantStdout: "--upstream URL  (IDEM_UPSTREAM)"},
		{name: "help unknown", args: []string{"help", "nope"}, wantCode: ExitUsage, wantStderr: `unknown command "nope"`},
		{name: "unknown command", args: []string{"nope"}, wantCode: ExitUsage, wantStderr: `idem: unknown command "nope"`},
		{name: "proxy -h", args: []string{"proxy", "-h"}, wantCode: ExitOK, wantStdout: "--scope-header NAME  (IDEM_SCOPE_HEADER)"},
		{name: "proxy --help", args: []string{"proxy", "--help"}, wantCode: ExitOK, wantStdout: "Usage: idem proxy --upstream URL [flags]"},
		{name: "proxy without upstream", args: []string{"proxy"}, wantCode: ExitUsage, wantStderr: "idem proxy: --upstream (or IDEM_UPSTREAM) is required\nRun 'idem proxy --help' for usage."},
		{name: "proxy unknown flag", args: []string{"proxy", "--nope"}, wantCode: ExitUsage, wantStderr: "idem proxy: unknown flag --nope\nRun"},
		{name: "proxy mistyped flag", args: []string{"proxy", "--upstrem", "http://u"}, wantCode: ExitUsage,
			wantStderr: "idem proxy: unknown flag --upstrem; did you mean --upstream?\nRun 'idem proxy --help' for usage."},
		{name: "proxy mistyped flag, one dash", args: []string{"proxy", "-upstrem=http://u"}, wantCode: ExitUsage,
			wantStderr: "unknown flag --upstrem; did you mean --upstream?"},
		{name: "proxy mistyped flag, transposed", args: []string{"proxy", "--upstream", "http://u", "--scope-haeder", "X"}, wantCode: ExitUsage,
			wantStderr: "unknown flag --scope-haeder; did you mean --scope-header?"},
		{name: "keys list mistyped flag", args: []string{"keys", "list", "--limt", "5"}, wantCode: ExitUsage,
			wantStderr: "unknown flag --limt; did you mean --limit?"},
		{name: "proxy flag without its value", args: []string{"proxy", "--upstream"}, wantCode: ExitUsage, wantStderr: "idem proxy: flag --upstream needs a value\n"},
		{name: "proxy bad flag value", args: []string{"proxy", "--upstream", "http://u", "--ttl", "soon"}, wantCode: ExitUsage, wantStderr: `invalid value "soon" for --ttl`},
		{name: "proxy bad boolean", args: []string{"proxy", "--upstream", "http://u", "--require-key=maybe"}, wantCode: ExitUsage, wantStderr: `invalid value "maybe" for --require-key`},
		{name: "proxy bad env value", args: []string{"proxy"}, env: map[string]string{"IDEM_UPSTREAM": "http://u", "IDEM_TTL": "soon"}, wantCode: ExitUsage, wantStderr: `invalid value "soon" for IDEM_TTL`},
		{name: "proxy -h scoped variable", args: []string{"proxy", "-h"}, wantCode: ExitOK, wantStdout: "--listen ADDR  (IDEM_PROXY_LISTEN)"},
		{name: "load -h scoped variables", args: []string{"load", "-h"}, wantCode: ExitOK, wantStdout: "--body JSON  (IDEM_LOAD_BODY)"},
		{name: "keys resolve -h scoped variables", args: []string{"keys", "resolve", "-h"}, wantCode: ExitOK, wantStdout: "(IDEM_KEYS_BODY)"},
		{name: "proxy reads its own listen variable", args: []string{"proxy", "--upstream", "http://u", "--store", "memory:"},
			env: map[string]string{"IDEM_PROXY_LISTEN": "256.0.0.1:1", "IDEM_PAYMENTS_LISTEN": "127.0.0.1:0"}, wantCode: ExitError, wantStderr: "lookup 256.0.0.1"},
		{name: "unscoped listen variable refused", args: []string{"proxy", "--upstream", "http://u"}, env: map[string]string{"IDEM_LISTEN": ":9"},
			wantCode: ExitUsage, wantStderr: "IDEM_LISTEN is set, but --listen means something else in each command: set IDEM_PROXY_LISTEN instead"},
		{name: "unscoped body variable refused", args: []string{"load", "--url", "http://127.0.0.1:9/x"}, env: map[string]string{"IDEM_BODY": "{}"},
			wantCode: ExitUsage, wantStderr: "set IDEM_LOAD_BODY instead"},
		{name: "proxy positional argument", args: []string{"proxy", "--upstream", "http://u", "extra"}, wantCode: ExitUsage, wantStderr: `unexpected argument "extra"`},
		{name: "proxy store fails to open", args: []string{"proxy", "--upstream", "http://u", "--store", "sqlite:/nonexistent-dir/x/idem.db"}, wantCode: ExitError, wantStderr: "idem proxy: opening the store:"},
		{name: "proxy cannot listen", args: []string{"proxy", "--upstream", "http://u", "--store", "memory:", "--listen", "256.0.0.1:1"}, wantCode: ExitError, wantStderr: "idem proxy: listen tcp"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newTestEnv(tt.env)
			code := run(t.Context(), tt.args, e.env)
			if code != tt.wantCode {
				t.Errorf("exit code = %d, want %d\nstdout: %s\nstderr: %s", code, tt.wantCode, e.stdout, e.stderr)
			}
			check := func(stream, got, want string) {
				if want == "" && got != "" {
					t.Errorf("%s = %q, want it empty", stream, got)
				}
				if !strings.Contains(got, want) {
					t.Errorf("%s = %q, want it to contain %q", stream, got, want)
				}
			}
			check("stdout", e.stdout.String(), tt.wantStdout)
			check("stderr", e.stderr.String(), tt.wantStderr)
		})
	}
}

// Adding a command is a table entry: every listed command has a help text
// reachable through both spellings.
func TestEveryCommandHasHelp(t *testing.T) {
	t.Parallel()
	for _, c := range commands {
		for _, args := range [][]string{{c.name, "-h"}, {"help", c.name}} {
			e := newTestEnv(nil)
			if code := run(context.Background(), args, e.env); code != ExitOK {
				t.Errorf("idem %s: exit %d, stderr %s", strings.Join(args, " "), code, e.stderr)
			}
			if !strings.Contains(e.stdout.String(), "Usage: idem "+c.name) {
				t.Errorf("idem %s printed %q, want its usage", strings.Join(args, " "), e.stdout)
			}
		}
	}
}

func TestEditDistance(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"", "abc", 3}, {"upstream", "upstream", 0},
		{"upstrem", "upstream", 1}, {"limt", "limit", 1}, {"scope-haeder", "scope-header", 1},
		{"lsiten", "listen", 1}, {"stroe", "store", 1}, {"ttl", "wait", 4}, {"nope", "lease", 4},
	} {
		if got := editDistance(tt.a, tt.b); got != tt.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
		if got := editDistance(tt.b, tt.a); got != tt.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tt.b, tt.a, got, tt.want)
		}
	}
}
