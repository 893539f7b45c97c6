package e2e

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/cmd/idem/internal/idembin"
	"github.com/idem-dev/idem/idempgx"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv"
)

var (
	// The tests share one pool to the test database; every test works in a
	// schema of its own.
	poolMu sync.Mutex
	pool   *pgxpool.Pool
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(runChild(mode))
	}
	if spec := os.Getenv(consumerEnv); spec != "" {
		os.Exit(runConsumer(spec))
	}
	code := m.Run()
	poolMu.Lock()
	if pool != nil {
		pool.Close()
	}
	poolMu.Unlock()
	idembin.Remove()
	os.Exit(code)
}

// testPool returns the shared pool, opening it on first use.
func testPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	dsn := testenv.PostgresURL(t)
	poolMu.Lock()
	defer poolMu.Unlock()
	if pool != nil {
		return pool
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("parsing the test database url: %v", err)
	}
	cfg.MaxConns = 6
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("connecting to the test database: %v", err)
	}
	pool = p
	return pool
}

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// env is one test's database: a migrated idem schema of its own, dropped
// when the test ends, and a store on it to inspect records.
type env struct {
	t      *testing.T
	pool   *pgxpool.Pool
	schema string // unquoted
	store  *idempgx.Store
}

func newEnv(t *testing.T) *env {
	t.Helper()
	p := testPool(t)
	schema := "idem_e2e_" + randomHex(6)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := p.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	s := idempgx.New(p, &idempgx.Config{Schema: schema})
	t.Cleanup(s.Close)
	if _, err := s.Migrate(t.Context()); err != nil {
		t.Fatalf("migrating %s: %v", schema, err)
	}
	return &env{t: t, pool: p, schema: schema, store: s}
}

// table returns the quoted name of a table in the test's schema.
func (e *env) table(name string) string {
	return pgx.Identifier{e.schema, name}.Sanitize()
}

// exec runs a statement in the test's database.
func (e *env) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.pool.Exec(e.t.Context(), sql, args...); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

// count runs a query that returns one integer.
func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(e.t.Context(), sql, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// storeURL is the --store URL of a proxy on the test's schema, with a
// bounded pool so that several processes stay within max_connections.
func (e *env) storeURL(maxConns int) string {
	e.t.Helper()
	u, err := url.Parse(testenv.PostgresURL(e.t))
	if err != nil {
		e.t.Fatal(err)
	}
	q := u.Query()
	q.Set("schema", e.schema)
	q.Set("pool_max_conns", fmt.Sprint(maxConns))
	u.RawQuery = q.Encode()
	return u.String()
}

// record returns the only record of the test's schema.
func (e *env) record() *idemstore.Record {
	e.t.Helper()
	recs, err := e.store.KeyList(e.t.Context(), &idemstore.ListParams{})
	if err != nil {
		e.t.Fatalf("listing records: %v", err)
	}
	if len(recs) != 1 {
		e.t.Fatalf("%d records, want 1", len(recs))
	}
	return recs[0]
}

// proc is a server process of a test: the idem command or this test binary
// as a child. Its output is kept and shown when the test fails.
type proc struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd
	// URL is the server's base URL, from the address it logged.
	URL string

	mu      sync.Mutex
	lines   []string
	changed chan struct{} // closed and replaced on every new line
	eof     chan struct{} // closed when the output has ended
	done    chan struct{} // closed when the process has exited
	waitErr error
}

// listeningRE finds the bound address in the start-up log line that the
// idem command (and the test's child servers) write to stderr: msg=listening,
// or msg="provider listening" for `idem provider`.
var listeningRE = regexp.MustCompile(`\bmsg=(?:listening\b|"provider listening")\s.*?\baddr=(\S+)`)

// start starts cmd and waits until it logs the address it listens on.
func start(t *testing.T, name string, cmd *exec.Cmd) *proc {
	t.Helper()
	p := &proc{t: t, name: name, cmd: cmd, changed: make(chan struct{}), eof: make(chan struct{}), done: make(chan struct{})}
	setPdeathsig(cmd)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		t.Fatalf("starting %s: %v", name, err)
	}
	w.Close()
	go p.read(r)
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.waitErr = err
		p.mu.Unlock()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		out := p.output()
		if strings.Contains(out, "WARNING: DATA RACE") {
			t.Errorf("%s reported a data race:\n%s", name, out)
		} else if t.Failed() {
			t.Logf("%s output:\n%s", name, out)
		}
	})
	m := p.waitLine(listeningRE, 60*time.Second)
	if m == nil {
		t.Fatalf("%s did not report its address; output:\n%s", name, p.output())
	}
	p.URL = "http://" + m[1]
	return p
}

func (p *proc) read(r io.ReadCloser) {
	defer close(p.eof)
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		p.mu.Lock()
		p.lines = append(p.lines, sc.Text())
		close(p.changed)
		p.changed = make(chan struct{})
		p.mu.Unlock()
	}
}

// waitLine waits up to timeout for an output line matching re and returns
// its submatches, or nil when the time runs out or the output ends first.
func (p *proc) waitLine(re *regexp.Regexp, timeout time.Duration) []string {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	seen := 0
	for {
		p.mu.Lock()
		lines, changed := p.lines[seen:], p.changed
		seen = len(p.lines)
		p.mu.Unlock()
		for _, l := range lines {
			if m := re.FindStringSubmatch(l); m != nil {
				return m
			}
		}
		select {
		case <-changed:
		case <-p.eof:
			p.mu.Lock()
			rest := p.lines[seen:]
			p.mu.Unlock()
			for _, l := range rest {
				if m := re.FindStringSubmatch(l); m != nil {
					return m
				}
			}
			return nil
		case <-timer.C:
			return nil
		}
	}
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *proc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGKILL)
	p.wait(p.t, 30*time.Second)
}

// wait waits up to timeout for the process to exit and returns how it
// ended.
func (p *proc) wait(t *testing.T, timeout time.Duration) error {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("%s did not exit within %v", p.name, timeout)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waitErr
}

// killedBySIGKILL reports whether the process ended by SIGKILL.
func (p *proc) killedBySIGKILL() bool {
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// startProxy starts `idem proxy` in front of upstream on the test's schema.
func (e *env) startProxy(name, upstream string, maxConns int, args ...string) *proc {
	e.t.Helper()
	cmd := exec.Command(idembin.Path(e.t), append([]string{"proxy",
		"--listen", "127.0.0.1:0", "--upstream", upstream, "--store", e.storeURL(maxConns)}, args...)...)
	cmd.Env = idembin.Environ()
	return start(e.t, name, cmd)
}

// client is the HTTP client of the tests: many connections per host, no
// connection reuse across killed processes.
var client = &http.Client{
	Timeout: 60 * time.Second,
	Transport: &http.Transport{
		MaxIdleConns:        1000,
		MaxIdleConnsPerHost: 500,
		IdleConnTimeout:     5 * time.Second,
	},
}

// answer is an HTTP answer as the tests compare them.
type answer struct {
	status     int
	body       []byte
	replayed   string
	retryAfter string
	code       string // the problem's code, for problem+json answers
	err        error
}

func (a answer) String() string {
	if a.err != nil {
		return "error: " + a.err.Error()
	}
	return fmt.Sprintf("%d %s replayed=%q retry-after=%q %s", a.status, a.code, a.replayed, a.retryAfter, a.body)
}

// post sends a POST with an Idempotency-Key and a JSON body.
func post(ctx context.Context, url, key, body string) answer {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set(idem.HeaderKey, key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, body: b, replayed: resp.Header.Get(idem.HeaderReplayed),
		retryAfter: resp.Header.Get("Retry-After"), err: err}
	if resp.Header.Get("Content-Type") == "application/problem+json" {
		var p idem.Problem
		if json.Unmarshal(b, &p) == nil {
			a.code = p.Code
		}
	}
	return a
}

// retryWhileInUse posts until the answer is something else than 409
// key-in-use (a live lease of an earlier attempt), or fails the test at the
// deadline. It returns the first other answer.
func retryWhileInUse(t *testing.T, url, key, body string, timeout time.Duration) answer {
	t.Helper()
	start := time.Now()
	deadline := start.Add(timeout)
	for inUse := 0; ; inUse++ {
		a := post(t.Context(), url, key, body)
		if a.err != nil || a.status != http.StatusConflict || a.code != idem.CodeKeyInUse {
			t.Logf("%d answers key-in-use over %v, then %v", inUse, time.Since(start).Round(time.Millisecond), a)
			return a
		}
		if a.retryAfter == "" {
			t.Fatalf("409 key-in-use without Retry-After: %v", a)
		}
		if time.Now().After(deadline) {
			t.Fatalf("still key-in-use after %v: %v", timeout, a)
		}
		time.Sleep(100 * time.Millisecond) // the lease runs on real time
	}
}
