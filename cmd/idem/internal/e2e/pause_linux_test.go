package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idem-dev/idem/cmd/idem/internal/idembin"
	"github.com/idem-dev/idem/cmd/idem/internal/storeurl"
	"github.com/idem-dev/idem/idemstore"
)

// stalledListener is a loopback TCP listener whose accept queue is full
// until release: the kernel drops every new connection's SYN, so a client's
// connect waits in SYN retransmission (1 s, then 2 s, 4 s, 8 s … later),
// with nothing sent. It is an upstream that is slow to reach, without any
// hook in the proxy.
type stalledListener struct {
	net.Listener
	filler   net.Conn      // the connection that fills the queue
	accepted chan net.Conn // every connection accepted after release
}

// newStalledListener listens with a backlog of 0, which Linux lets hold one
// connection, and makes that connection itself.
func newStalledListener(t *testing.T) *stalledListener {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		syscall.Close(fd)
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		syscall.Close(fd)
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "stalled-listener")
	ln, err := net.FileListener(f) // a dup: f is closed below
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	filler, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatalf("filling the accept queue: %v", err)
	}
	t.Cleanup(func() { filler.Close() })
	return &stalledListener{Listener: ln, filler: filler, accepted: make(chan net.Conn, 16)}
}

// URL is the listener's base URL.
func (l *stalledListener) URL() string { return "http://" + l.Addr().String() }

// release serves h on the listener from now on: the queued filler is
// accepted and closed, which makes room for the next SYN retransmission of
// a waiting client.
func (l *stalledListener) release(t *testing.T, h http.Handler) {
	t.Helper()
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	t.Cleanup(func() { srv.Close() })
	first := true
	go srv.Serve(listenerFunc{l.Listener, func(c net.Conn) {
		if first {
			first = false // the filler
			return
		}
		l.accepted <- c
	}})
	l.filler.Close()
}

// waitConnecting waits until a connection to the listener is in SYN_SENT
// (/proc/net/tcp): a client started its connect, which the full queue
// holds back.
func (l *stalledListener) waitConnecting(t *testing.T, timeout time.Duration) {
	t.Helper()
	port := fmt.Sprintf(":%04X ", l.Addr().(*net.TCPAddr).Port)
	deadline := time.Now().Add(timeout)
	for {
		table, err := os.ReadFile("/proc/net/tcp")
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(string(table)) {
			// sl local_address rem_address st …; st 02 is SYN_SENT.
			f := strings.Fields(line)
			if len(f) > 3 && strings.HasSuffix(f[2]+" ", port) && f[3] == "02" {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no connection to %s started within %v", l.Addr(), timeout)
		}
		time.Sleep(5 * time.Millisecond) // the proxy runs on real time
	}
}

// listenerFunc calls onAccept with every connection it accepts.
type listenerFunc struct {
	net.Listener
	onAccept func(net.Conn)
}

func (l listenerFunc) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.onAccept(c)
	}
	return c, err
}

// lookups is a reconcile lookup that never found anything: it answers 404
// to every key and counts the lookups.
type lookups struct {
	mu sync.Mutex
	n  map[string]int
}

func (l *lookups) serve(w http.ResponseWriter, r *http.Request) {
	l.mu.Lock()
	l.n[r.PathValue("key")]++
	l.mu.Unlock()
	http.NotFound(w, r)
}

func (l *lookups) count(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n[key]
}

// TestPausedProxyRunsOnce is issue 24's scenario, on PostgreSQL and on
// Redis. Proxy A reserves a key and then cannot reach the upstream at once
// (its connect waits in SYN retransmission: the upstream's accept queue is
// full), and the test stops it with SIGSTOP: a GC pause, a VM stall, a
// partition. A's lease runs out; proxy B, with --maintain and a
// --reconcile-url that answers 404 (the upstream has not seen the
// request), turns the record unknown, waits its --reconcile-grace, asks,
// and releases it; the client's retry through B runs the operation. Then
// the upstream becomes reachable, A's connect completes while it is still
// stopped, and A gets SIGCONT: it must not send its request, since its
// lease is gone. The upstream runs the operation exactly once, and a retry
// through A replays B's answer.
func TestPausedProxyRunsOnce(t *testing.T) {
	t.Parallel()
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		testPausedProxy(t, newEnv(t).storeURL(3))
	})
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		testPausedProxy(t, startRedisServer(t).URL())
	})
}

func testPausedProxy(t *testing.T, storeURL string) {
	const (
		key   = "paused-proxy"
		body  = `{"amount":1000}`
		lease = 2 * time.Second
		grace = time.Second
	)
	store, closeStore, err := storeurl.Open(t.Context(), storeURL)
	if err != nil {
		t.Fatalf("opening the store: %v", err)
	}
	t.Cleanup(func() { closeStore() })
	id := idemstore.Identity{Endpoint: "POST /v1/payments", Key: key}

	up := &upstream{entered: make(chan string, 16), runs: make(map[string]int)}
	look := &lookups{n: make(map[string]int)}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /lookup/{key}", look.serve)
	mux.HandleFunc("/", up.serve)
	srv := &http.Server{Handler: mux}
	direct, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(direct)
	t.Cleanup(func() { srv.Close() })
	directURL := "http://" + direct.Addr().String()
	stalled := newStalledListener(t)

	start := func(name, upstream string, args ...string) *proc {
		t.Helper()
		cmd := execIdem(t, append([]string{"proxy", "--listen", "127.0.0.1:0", "--upstream", upstream,
			"--store", storeURL, "--lease", lease.String()}, args...)...)
		return start(t, name, cmd)
	}
	a := start("proxy-a", stalled.URL())
	b := start("proxy-b", directURL, "--maintain",
		"--reconcile-url", directURL+"/lookup/{key}",
		"--reconcile-interval", "100ms", "--reconcile-grace", grace.String())

	// A reserves the key, then waits for its connection to the upstream.
	answerA := make(chan answer, 1)
	go func() { answerA <- post(context.Background(), a.URL+"/v1/payments", key, body) }()
	waitRecord(t, store, id, 10*time.Second, func(r *idemstore.Record) bool { return r.State == idemstore.StateInProgress })
	stalled.waitConnecting(t, 10*time.Second)
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	t.Cleanup(func() { a.cmd.Process.Signal(syscall.SIGCONT) })

	// B's reconciler finds the expired lease, waits the grace, asks, gets
	// 404 and releases the record.
	waitRecord(t, store, id, 30*time.Second, func(r *idemstore.Record) bool { return r.State == idemstore.StateReleased })
	if n := look.count(key); n != 1 {
		t.Fatalf("the reconciler asked %d times, want once", n)
	}
	// The client's retry runs through B.
	gotB := post(t.Context(), b.URL+"/v1/payments", key, body)
	if gotB.status != http.StatusCreated || gotB.replayed != "" {
		t.Fatalf("the retry through B: %v, want 201, executed", gotB)
	}
	if n := up.executions(key); n != 1 {
		t.Fatalf("after B's run the upstream ran the key %d times, want 1", n)
	}

	// The upstream becomes reachable: A's connection completes while it is
	// stopped (the kernel retransmits its SYN), then A resumes.
	stalled.release(t, mux)
	select {
	case <-stalled.accepted:
	case <-time.After(30 * time.Second):
		t.Fatal("A's connection to the upstream never arrived")
	}
	t.Logf("A was stopped for %v", time.Since(stopped).Round(time.Millisecond))
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	var gotA answer
	select {
	case gotA = <-answerA:
	case <-time.After(30 * time.Second):
		t.Fatal("A never answered after SIGCONT")
	}
	t.Logf("A answered %v", gotA)
	if n := up.executions(key); n != 1 {
		t.Fatalf("the upstream ran the key %d times, want 1 (A sent its request after its lease was gone)", n)
	}
	if gotA.status/100 == 2 {
		t.Errorf("A answered %v: success for a request it must not have sent", gotA)
	}
	// A retry through A replays B's run.
	again := post(t.Context(), a.URL+"/v1/payments", key, body)
	if again.status != http.StatusCreated || again.replayed != "true" || string(again.body) != string(gotB.body) {
		t.Errorf("the retry through A: %v, want B's answer replayed: %s", again, gotB.body)
	}
	if n := up.executions(key); n != 1 {
		t.Fatalf("the upstream ran the key %d times, want 1", n)
	}
}

// execIdem is the idem command with args and the test's environment
// without IDEM_* variables.
func execIdem(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(idembin.Path(t), args...)
	cmd.Env = idembin.Environ()
	return cmd
}

// waitRecord polls the store until the record id satisfies ok, and fails
// the test after timeout.
func waitRecord(t *testing.T, store idemstore.Store, id idemstore.Identity, timeout time.Duration, ok func(*idemstore.Record) bool) *idemstore.Record {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		r, err := store.KeyGet(t.Context(), id)
		if err == nil && ok(r) {
			return r
		}
		if time.Now().After(deadline) {
			if err != nil {
				t.Fatalf("after %v: reading the record: %v", timeout, err)
			}
			t.Fatalf("after %v the record is %s (locked until %v)", timeout, r.State, r.LockedUntil)
		}
		time.Sleep(10 * time.Millisecond) // the proxies run on real time
	}
}
