package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// binary is the idem command built by TestMain.
var binary string

// vcsStamped reports whether TestMain built binary with the checkout's VCS
// revision.
var vcsStamped bool

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "idem-cmd-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "idem")
	build := []string{"build", "-o", binary}
	if root, err := exec.Command("git", "rev-parse", "--show-toplevel").Output(); err == nil {
		if fi, err := os.Stat(filepath.Join(strings.TrimSpace(string(root)), ".git")); err == nil && fi.IsDir() {
			vcsStamped = true
			build = append(build, "-buildvcs=true")
		}
	}
	if out, err := exec.Command("go", append(build, ".")...).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building idem: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// logBuffer collects a process's stderr; a test can wait for a text.
type logBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	written chan struct{} // closed and replaced at every write
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.written != nil {
		close(b.written)
		b.written = nil
	}
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitFor returns the first match of re written within timeout, or nil.
func (b *logBuffer) waitFor(re *regexp.Regexp, timeout time.Duration) []string {
	deadline := time.After(timeout)
	for {
		b.mu.Lock()
		m := re.FindStringSubmatch(b.buf.String())
		if b.written == nil {
			b.written = make(chan struct{})
		}
		written := b.written
		b.mu.Unlock()
		if m != nil {
			return m
		}
		select {
		case <-written:
		case <-deadline:
			return nil
		}
	}
}

// proc is a running `idem proxy`.
type proc struct {
	cmd     *exec.Cmd
	url     string
	stderr  *logBuffer
	exited  chan struct{}
	waitErr error // set when exited is closed
}

var listeningRE = regexp.MustCompile(`msg=listening addr=(127\.0\.0\.1:\d+)`)

// startProxy runs `idem proxy --listen 127.0.0.1:0 args...` without any
// IDEM_* variable of the test's environment, and waits until it listens.
func startProxy(t *testing.T, args ...string) *proc {
	t.Helper()
	p := &proc{stderr: &logBuffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command(binary, append([]string{"proxy", "--listen", "127.0.0.1:0"}, args...)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "IDEM_") {
			p.cmd.Env = append(p.cmd.Env, kv)
		}
	}
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.waitErr = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("idem proxy stderr:\n%s", p.stderr)
		}
	})
	m := p.stderr.waitFor(listeningRE, 30*time.Second)
	if m == nil {
		t.Fatalf("idem proxy did not report its address; stderr:\n%s", p.stderr)
	}
	p.url = "http://" + m[1]
	return p
}

// terminate sends SIGTERM.
func (p *proc) terminate(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
}

// exitCode waits up to timeout for the process to exit and returns its code.
func (p *proc) exitCode(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(timeout):
		t.Fatalf("idem proxy did not exit within %v", timeout)
	}
	var exitErr *exec.ExitError
	if errors.As(p.waitErr, &exitErr) {
		return exitErr.ExitCode()
	}
	if p.waitErr != nil {
		t.Fatal(p.waitErr)
	}
	return 0
}

func (p *proc) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// upstream counts its calls per path. /slow waits until release is closed.
type upstream struct {
	*httptest.Server
	calls   atomic.Int32
	arrived chan struct{} // receives when a /slow call arrives
	release chan struct{}
	ctxErr  chan error // receives the /slow call's context error when it answers
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{arrived: make(chan struct{}, 10), release: make(chan struct{}), ctxErr: make(chan error, 10)}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := u.calls.Add(1)
		body, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/slow" {
			u.arrived <- struct{}{}
			select {
			case <-u.release:
			case <-time.After(20 * time.Second): // bound a broken test
			}
			u.ctxErr <- r.Context().Err()
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"call":%d,"path":%q,"body":%s,"at":%q}`, n, r.URL.Path, strconv.Quote(string(body)), time.Now().Format(time.RFC3339Nano))
	}))
	t.Cleanup(u.Close)
	return u
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

func send(ctx context.Context, url, key, body string) (*answer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return &answer{resp.StatusCode, resp.Header, b}, err
}

func post(t *testing.T, url, key, body string) *answer {
	t.Helper()
	a, err := send(t.Context(), url, key, body)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func assertReplay(t *testing.T, got, first *answer) {
	t.Helper()
	if got.status != first.status || !bytes.Equal(got.body, first.body) {
		t.Errorf("retry = %d %s, want the first answer %d %s byte for byte", got.status, got.body, first.status, first.body)
	}
	if got.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry lacks Idempotent-Replayed: true (headers %v)", got.header)
	}
}

// The proxy runs the upstream once per key, replays byte for byte, refuses a
// reused key, drains the request in flight on SIGTERM and exits 0, and a new
// process on the same SQLite file still replays.
func TestProxyEndToEnd(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	store := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	p := startProxy(t, "--upstream", up.URL, "--store", store)

	first := post(t, p.url+"/v1/payments", "key-a", `{"amount":100}`)
	if first.status != http.StatusCreated || first.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first answer = %d %s (replayed %q), want a fresh 201", first.status, first.body, first.header.Get("Idempotent-Replayed"))
	}
	assertReplay(t, post(t, p.url+"/v1/payments", "key-a", `{"amount":100}`), first)
	// The same JSON spelled differently is the same request.
	assertReplay(t, post(t, p.url+"/v1/payments", "key-a", `{ "amount" : 1e2 }`), first)
	if n := up.calls.Load(); n != 1 {
		t.Errorf("upstream called %d times, want 1", n)
	}
	if a := post(t, p.url+"/v1/payments", "key-a", `{"amount":200}`); a.status != http.StatusUnprocessableEntity ||
		a.header.Get("Content-Type") != "application/problem+json" || !bytes.Contains(a.body, []byte(`"key-reused"`)) {
		t.Errorf("other body, same key = %d %s, want 422 key-reused", a.status, a.body)
	}

	// SIGTERM with a request in flight: the request completes, then the
	// process exits 0.
	slowc := make(chan *answer, 1)
	go func() {
		a, err := send(context.Background(), p.url+"/slow", "key-b", `{}`)
		if err != nil {
			t.Errorf("in-flight request: %v", err)
		}
		slowc <- a
	}()
	<-up.arrived
	p.terminate(t)
	if p.stderr.waitFor(regexp.MustCompile(`msg="shutting down"`), 10*time.Second) == nil {
		t.Fatal("no shutdown after SIGTERM")
	}
	if !p.running() {
		t.Fatal("the process exited with a request in flight")
	}
	close(up.release)
	slow := <-slowc
	if slow == nil || slow.status != http.StatusCreated {
		t.Fatalf("in-flight request answered %+v, want 201", slow)
	}
	if code := p.exitCode(t, 10*time.Second); code != 0 {
		t.Errorf("exit code after SIGTERM = %d, want 0", code)
	}

	// A new process on the same file replays both keys.
	p2 := startProxy(t, "--upstream", up.URL, "--store", store)
	assertReplay(t, post(t, p2.url+"/v1/payments", "key-a", `{"amount":100}`), first)
	assertReplay(t, post(t, p2.url+"/slow", "key-b", `{}`), slow)
	if n := up.calls.Load(); n != 2 {
		t.Errorf("upstream called %d times in all, want 2", n)
	}
	p2.terminate(t)
	if code := p2.exitCode(t, 10*time.Second); code != 0 {
		t.Errorf("exit code after SIGTERM = %d, want 0", code)
	}
	if logs := p.stderr.String() + p2.stderr.String(); strings.Contains(logs, "key-a") || strings.Contains(logs, "key-b") {
		t.Errorf("logs contain a key:\n%s", logs)
	}
}

// A client that hangs up mid-request does not stop the upstream call; the
// retry gets the stored answer.
func TestProxyClientHangsUp(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	p := startProxy(t, "--upstream", up.URL, "--store", "sqlite:"+filepath.Join(t.TempDir(), "idem.db"), "--wait", "10s")

	ctx, cancel := context.WithCancel(context.Background())
	hungUp := make(chan error, 1)
	go func() {
		_, err := send(ctx, p.url+"/slow", "key-c", `{"amount":1}`)
		hungUp <- err
	}()
	<-up.arrived
	cancel()
	if err := <-hungUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("client error = %v, want context.Canceled", err)
	}
	close(up.release)
	if err := <-up.ctxErr; err != nil {
		t.Errorf("the upstream call's context ended with %v: the hang-up reached it", err)
	}
	// The retry waits (--wait) for the call to finish and gets its answer.
	a := post(t, p.url+"/slow", "key-c", `{"amount":1}`)
	if a.status != http.StatusCreated || a.header.Get("Idempotent-Replayed") != "true" || !bytes.Contains(a.body, []byte(`"call":1`)) {
		t.Errorf("retry = %d %s (replayed %q), want the stored 201 of call 1", a.status, a.body, a.header.Get("Idempotent-Replayed"))
	}
	if n := up.calls.Load(); n != 1 {
		t.Errorf("upstream called %d times, want 1", n)
	}
	p.terminate(t)
	if code := p.exitCode(t, 10*time.Second); code != 0 {
		t.Errorf("exit code = %d, want 0", code)
	}
}

// TestVersion runs `idem version` on the binary TestMain built: in a git
// checkout whose .git is a directory (the Go toolchain does not stamp from a
// worktree's .git file), TestMain built it with -buildvcs=true and the
// revision must be the checked-out one.
func TestVersion(t *testing.T) {
	t.Parallel()
	out, err := exec.Command(binary, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("idem version: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "module    github.com/idem-dev/idem/cmd/idem\n") {
		t.Errorf("no module line:\n%s", out)
	}
	if !vcsStamped {
		if !strings.Contains(string(out), "revision  unknown") {
			t.Errorf("built without VCS stamping, want revision unknown:\n%s", out)
		}
		t.Skip("the checkout's .git is not a directory: the toolchain stamps no revision")
	}
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatalf("git rev-parse HEAD: %v", err)
	}
	if want := "revision  " + strings.TrimSpace(string(head)); !strings.Contains(string(out), want) {
		t.Errorf("want %q in:\n%s", want, out)
	}
}
