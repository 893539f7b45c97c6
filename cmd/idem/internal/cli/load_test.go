package cli

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/cmd/idem/internal/loadgen"
	"github.com/idem-dev/idem/idemmem"
)

func TestParseLoad(t *testing.T) {
	t.Parallel()
	const u = "http://127.0.0.1:8080/v1/payments"
	defaults := func() loadOptions {
		return loadOptions{
			target:      "any",
			concurrency: loadgen.DefaultConcurrency, duration: 10 * time.Second, duplicates: 1,
			body: loadgen.DefaultBody, header: http.Header{}, timeout: loadgen.DefaultTimeout,
		}
	}
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    func(o *loadOptions) // edits the defaults; url is checked apart
		wantErr string
	}{
		{name: "defaults", args: []string{"--url", u}, want: func(*loadOptions) {}},
		{name: "every flag",
			args: []string{"--url", u, "--concurrency", "3", "--requests", "100", "--keys", "10", "--duplicates", "4",
				"--body", `{"a":1}`, "--header", "X-Tenant: t1", "--header", "authorization:Bearer x", "--timeout", "2s", "--json"},
			want: func(o *loadOptions) {
				o.concurrency, o.duration, o.requests, o.keys, o.duplicates = 3, 0, 100, 10, 4
				o.body, o.timeout, o.json = `{"a":1}`, 2*time.Second, true
				o.header = http.Header{"X-Tenant": {"t1"}, "Authorization": {"Bearer x"}}
			}},
		{name: "variables",
			env:  map[string]string{"IDEM_URL": u, "IDEM_DURATION": "3s", "IDEM_KEYS": "5", "IDEM_CONCURRENCY": "2"},
			want: func(o *loadOptions) { o.duration, o.keys, o.concurrency = 3*time.Second, 5, 2 }},
		{name: "body variable", args: []string{"--url", u}, env: map[string]string{"IDEM_LOAD_BODY": `{"b":2}`},
			want: func(o *loadOptions) { o.body = `{"b":2}` }},
		{name: "a plan has no default duration", args: []string{"--url", u, "--keys", "5"},
			want: func(o *loadOptions) { o.duration, o.keys = 0, 5 }},
		{name: "payments target", args: []string{"--target", "payments", "--token", "tok_1"},
			want: func(o *loadOptions) {
				o.target, o.token, o.body = "payments", "tok_1", paymentsLoadBody
				o.header = http.Header{"Authorization": {"Bearer tok_1"}}
			}},
		{name: "payments target keeps --body", args: []string{"--target", "payments", "--body", `{"a":1}`},
			want: func(o *loadOptions) { o.target, o.body = "payments", `{"a":1}` }},
		{name: "token and authorization header", args: []string{"--url", u, "--token", "t", "--header", "Authorization: Bearer x"}, wantErr: "exclusive"},
		{name: "unknown target", args: []string{"--target", "shop"}, wantErr: "want one of any, payments"},
		{name: "localhost", args: []string{"--url", "http://localhost:9/x"}, want: func(*loadOptions) {}},
		{name: "ipv6 loopback", args: []string{"--url", "http://[::1]:9/x"}, want: func(*loadOptions) {}},
		{name: "remote allowed", args: []string{"--url", "https://api.example/x", "--allow-remote"},
			want: func(o *loadOptions) { o.allowRemote = true }},
		{name: "no url", args: nil, wantErr: "--url (or IDEM_URL) is required, or --target payments"},
		{name: "remote", args: []string{"--url", "https://api.example/x"}, wantErr: "api.example is not a loopback host"},
		{name: "duration and requests", args: []string{"--url", u, "--duration", "1s", "--requests", "5"}, wantErr: "exclusive"},
		{name: "duplicates without keys", args: []string{"--url", u, "--duplicates", "2"}, wantErr: "--duplicates needs --keys"},
		{name: "zero concurrency", args: []string{"--url", u, "--concurrency", "0"}, wantErr: "--concurrency must be positive"},
		{name: "zero requests", args: []string{"--url", u, "--requests", "0"}, wantErr: "--requests must be positive"},
		{name: "bad header", args: []string{"--url", u, "--header", "nocolon"}, wantErr: "want 'Name: value'"},
		{name: "key header", args: []string{"--url", u, "--header", "Idempotency-Key: k"}, wantErr: "idem load's own"},
		{name: "bad duration", args: []string{"--url", u, "--duration", "soon"}, wantErr: "invalid value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			o, err := parseLoad(tt.args, newTestEnv(tt.env).env)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseLoad = %v, want an error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := defaults()
			tt.want(&want)
			if o.url == nil {
				t.Fatal("no url")
			}
			got := *o
			got.url, want.url = nil, nil
			if !reflect.DeepEqual(got, want) {
				t.Errorf("options\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

// loadTarget is an httptest server with the idem middleware on the memory
// store, counting its handler's executions.
func loadTarget(t *testing.T) (url string, executions func() int) {
	t.Helper()
	var mu sync.Mutex
	runs := 0
	h := idem.New(idemmem.New(nil), &idem.Config{GuardConfig: idem.GuardConfig{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		runs++
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL + "/v1/payments", func() int {
		mu.Lock()
		defer mu.Unlock()
		return runs
	}
}

func TestLoadText(t *testing.T) {
	t.Parallel()
	url, executions := loadTarget(t)
	e := newTestEnv(nil)
	code := run(t.Context(), []string{"load", "--url", url, "--keys", "6", "--duplicates", "3", "--concurrency", "2"}, e.env)
	if code != ExitOK {
		t.Fatalf("exit %d\nstderr: %s", code, e.stderr)
	}
	out := e.stdout.String()
	for _, want := range []string{"target      POST " + url, "keys        6 distinct, each sent 3 times", "requests    18 in ",
		"with 2 workers", "latency     p50 ", "status      201: ", "replayed    absent: "} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if n := executions(); n != 6 {
		t.Errorf("the handler ran %d times, want once per key (6)", n)
	}
}

func TestLoadJSON(t *testing.T) {
	t.Parallel()
	url, executions := loadTarget(t)
	e := newTestEnv(nil)
	code := run(t.Context(), []string{"load", "--url", url, "--keys", "10", "--duplicates", "4", "--concurrency", "3", "--json"}, e.env)
	if code != ExitOK {
		t.Fatalf("exit %d\nstderr: %s", code, e.stderr)
	}
	var rep loadReport
	if err := json.Unmarshal([]byte(e.stdout.String()), &rep); err != nil {
		t.Fatalf("decoding %q: %v", e.stdout, err)
	}
	if rep.Requests != 40 || rep.Responses != 40 || rep.Errors != 0 || rep.Keys != 10 || rep.Duplicates != 4 || rep.Concurrency != 3 {
		t.Errorf("report %+v, want 40 answered requests of 10 keys × 4 by 3 workers", rep)
	}
	created, conflicts := rep.Status["201"], rep.Status["409"]
	if created+conflicts != 40 {
		t.Errorf("status %v, want 201s and 409s only", rep.Status)
	}
	if rep.Replayed["true"] != created-10 || rep.Replayed["absent"] != 10+conflicts {
		t.Errorf("replayed %v with status %v, want %d replays", rep.Replayed, rep.Status, created-10)
	}
	if n := executions(); n != 10 {
		t.Errorf("the handler ran %d times, want 10", n)
	}
	l := rep.LatencyMS
	if l.P50 <= 0 || l.P50 > l.P90 || l.P90 > l.P99 || l.P99 > l.Max || rep.Throughput <= 0 {
		t.Errorf("latency %+v, throughput %v: want ordered positive percentiles", l, rep.Throughput)
	}
}

func TestLoadUnanswered(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	e := newTestEnv(nil)
	code := run(t.Context(), []string{"load", "--url", url, "--requests", "3"}, e.env)
	if code != ExitError {
		t.Errorf("exit %d, want %d", code, ExitError)
	}
	if !strings.Contains(e.stderr.String(), "idem load: no request was answered") || !strings.Contains(e.stdout.String(), "errors      3 without an answer") {
		t.Errorf("stdout %q, stderr %q: want the errors reported", e.stdout, e.stderr)
	}
}

// The help shows the real default duration.
func TestLoadHelpShowsDefaultDuration(t *testing.T) {
	t.Parallel()
	e := newTestEnv(nil)
	if code := run(t.Context(), []string{"load", "-h"}, e.env); code != ExitOK {
		t.Fatalf("exit %d", code)
	}
	if out := e.stdout.String(); !strings.Contains(out, "without --requests or --keys) (default 10s)") {
		t.Errorf("--duration's default is not 10s:\n%s", out)
	}
}

// idem load fits idem payments: --target payments sends a body it accepts;
// without the token most answers are 401 and the report says to pass
// --token; with the default body the 422 hint names --target payments.
func TestLoadAgainstPayments(t *testing.T) {
	t.Parallel()
	pe := newTestEnv(nil)
	base, stop := payCommand(t, pe, payArgs(t, "--tokens", "acme="+payToken)...)
	defer func() {
		if code := stop(); code != ExitOK {
			t.Errorf("payments exit %d; stderr %s", code, pe.stderr)
		}
	}()
	url := base + "/v1/payments"
	load := func(args ...string) (*testEnv, int) {
		e := newTestEnv(nil)
		code := run(t.Context(), append([]string{"load", "--url", url, "--requests", "20", "--concurrency", "2"}, args...), e.env)
		return e, code
	}

	e, code := load("--target", "payments")
	if code != ExitOK || !strings.Contains(e.stdout.String(), "status      401: 20") {
		t.Fatalf("without a token: exit %d\n%s\n%s", code, e.stdout, e.stderr)
	}
	for _, want := range []string{"100% of the answers were 4xx; the first 401 said:", `"code":"unauthorized"`, "hint: the service wants a credential: --token TOKEN"} {
		if !strings.Contains(e.stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, e.stderr)
		}
	}

	e, _ = load("--token", payToken)
	for _, want := range []string{"the first 422 said:", "validation-failed", "hint: the service refuses the body: --target payments"} {
		if !strings.Contains(e.stderr.String(), want) {
			t.Errorf("default body: stderr lacks %q:\n%s", want, e.stderr)
		}
	}

	e, code = load("--target", "payments", "--token", payToken)
	if code != ExitOK || !strings.Contains(e.stdout.String(), "status      201: 20") || e.stderr.String() != "" {
		t.Fatalf("with --target payments and the token: exit %d\n%s\n%s", code, e.stdout, e.stderr)
	}
	if strings.Contains(e.stdout.String(), payToken) {
		t.Errorf("the report shows the token:\n%s", e.stdout)
	}
}
