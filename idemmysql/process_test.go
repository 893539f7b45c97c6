package idemmysql

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv"
	"github.com/idem-dev/idem/internal/testenv/mariadbproc"
)

// The process tests run this test binary again as a child that works on a
// database: IDEMMYSQL_CHILD names what it does, IDEMMYSQL_DSN the database.
const (
	childEnv = "IDEMMYSQL_CHILD"
	dsnEnv   = "IDEMMYSQL_DSN"
)

// bodyFor is the body the "hold" child stores for key.
func bodyFor(key string) []byte {
	return bytes.Repeat([]byte(key+"\x00\xff"), 100)
}

var childID = idemstore.Identity{Scope: "tenant", Endpoint: "POST /v1/payments"}

// TestHelperProcess is the child of the process tests; it does nothing when
// run by go test itself.
func TestHelperProcess(t *testing.T) {
	mode := os.Getenv(childEnv)
	if mode == "" {
		return
	}
	ctx := context.Background()
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(3)
	}
	s, err := Open(ctx, os.Getenv(dsnEnv), &Config{MaxConns: 8})
	if err != nil {
		fail(err)
	}
	// Every child migrates, as every idem process does when it starts.
	if _, err := s.Migrate(ctx); err != nil {
		fail(err)
	}
	reserve := func(key, token string) bool {
		id := childID
		id.Key = key
		res, err := s.KeyReserve(ctx, &idemstore.ReserveParams{
			Identity: id, Fingerprint: "fp", Token: token, Lease: time.Hour, TTL: 24 * time.Hour,
		})
		if err != nil {
			fail(err)
		}
		return res.Reserved
	}
	complete := func(key, token string, body []byte) {
		id := childID
		id.Key = key
		err := s.KeyComplete(ctx, &idemstore.CompleteParams{
			Identity: id, Token: token,
			Response: &idemstore.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/octet-stream"}}, Body: body},
		})
		if err != nil {
			fail(err)
		}
	}
	switch mode {
	case "hold":
		// Reserve a key and keep it, then complete keys one by one until
		// killed, saying so after each completion returned.
		if !reserve("held", "child-token") {
			fail(errors.New("held was not new"))
		}
		fmt.Println("reserved")
		deadline := time.Now().Add(time.Minute)
		for i := 0; time.Now().Before(deadline); i++ {
			key := fmt.Sprintf("k%06d", i)
			if !reserve(key, "token-"+key) {
				fail(fmt.Errorf("%s was not new", key))
			}
			complete(key, "token-"+key, bodyFor(key))
			fmt.Println("completed", key)
		}
		os.Exit(4)
	case "race":
		// Many goroutines of several processes reserve the same keys; print
		// the keys this process won.
		var wg sync.WaitGroup
		var mu sync.Mutex
		out := bufio.NewWriter(os.Stdout)
		for g := range 16 {
			wg.Go(func() {
				for k := range 30 {
					key := fmt.Sprintf("k%02d", (k+g)%30)
					token := fmt.Sprintf("%d-%d-%s", os.Getpid(), g, key)
					if reserve(key, token) {
						complete(key, token, []byte(token))
						mu.Lock()
						fmt.Fprintln(out, "won", key)
						mu.Unlock()
					}
				}
			})
		}
		wg.Wait()
		out.Flush()
		s.Close()
		os.Exit(0)
	}
	fail(fmt.Errorf("unknown mode %q", mode))
}

// child starts this test binary as a child in mode on the database dsn.
func child(t *testing.T, mode, dsn string) (*exec.Cmd, io.Reader) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+mode, dsnEnv+"="+dsn)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
		if t.Failed() && stderr.Len() > 0 {
			t.Logf("child %s stderr:\n%s", mode, stderr.String())
		}
	})
	return cmd, stdout
}

// lines delivers the lines of r on a channel, closed at EOF.
func lines(r io.Reader) <-chan string {
	ch := make(chan string)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			ch <- sc.Text()
		}
	}()
	return ch
}

// TestProcessesRace: three processes of 16 goroutines each reserve the
// same 30 keys of one new database at once (and race to migrate it): each
// key is won, and completed, exactly once across them.
func TestProcessesRace(t *testing.T) {
	t.Parallel()
	dsn := newDatabase(t)
	const processes = 3
	type result struct {
		out []byte
		err error
	}
	results := make(chan result, processes)
	for range processes {
		cmd, stdout := child(t, "race", dsn)
		go func() {
			out, _ := io.ReadAll(stdout)
			results <- result{out, cmd.Wait()}
		}()
	}
	wins := map[string]int{}
	for range processes {
		select {
		case r := <-results:
			if r.err != nil {
				t.Fatalf("child: %v", r.err)
			}
			for _, line := range strings.Split(strings.TrimSpace(string(r.out)), "\n") {
				if key, ok := strings.CutPrefix(line, "won "); ok {
					wins[key]++
				}
			}
		case <-time.After(2 * time.Minute):
			t.Fatal("children did not finish in 2 minutes")
		}
	}
	s, err := Open(t.Context(), dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for k := range 30 {
		key := fmt.Sprintf("k%02d", k)
		if wins[key] != 1 {
			t.Errorf("%s won %d times across %d processes, want once", key, wins[key], processes)
		}
		id := childID
		id.Key = key
		r, err := s.KeyGet(t.Context(), id)
		if err != nil || r.State != idemstore.StateCompleted || r.Attempts != 1 || string(r.Response.Body) != r.Token {
			t.Errorf("%s after the race: %+v, %v; want completed once with its winner's body", key, r, err)
		}
	}
}

// TestKilledProcess kills a process with SIGKILL in the middle of its
// reservations and completions: every completion it reported is stored
// whole, the key it held is still in progress under its token, and no
// record is torn.
func TestKilledProcess(t *testing.T) {
	t.Parallel()
	dsn := newDatabase(t)
	cmd, stdout := child(t, "hold", dsn)
	out := lines(stdout)
	var completed []string
	timeout := time.After(60 * time.Second)
	for len(completed) < 25 {
		select {
		case line, ok := <-out:
			if !ok {
				cmd.Wait()
				t.Fatalf("child exited early after %d completions", len(completed))
			}
			if key, ok := strings.CutPrefix(line, "completed "); ok {
				completed = append(completed, key)
			}
		case <-timeout:
			t.Fatalf("child completed only %d keys in 60s", len(completed))
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the child ended with %v, not by SIGKILL", cmd.ProcessState)
	}
	for line := range out {
		if key, ok := strings.CutPrefix(line, "completed "); ok {
			completed = append(completed, key)
		}
	}

	s, err := Open(t.Context(), dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := t.Context()
	id := childID
	id.Key = "held"
	r, err := s.KeyGet(ctx, id)
	if err != nil || r.State != idemstore.StateInProgress || r.Token != "child-token" {
		t.Fatalf("held key after the kill: %+v, %v; want in_progress with the child's token", r, err)
	}
	for _, key := range completed {
		id.Key = key
		r, err := s.KeyGet(ctx, id)
		if err != nil || r.State != idemstore.StateCompleted || r.Response == nil || !bytes.Equal(r.Response.Body, bodyFor(key)) {
			t.Fatalf("key %s, completed before the kill: %+v, %v", key, r, err)
		}
	}
	recs, err := s.KeyList(ctx, &idemstore.ListParams{Limit: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) < len(completed)+1 {
		t.Fatalf("%d records listed, want at least %d", len(recs), len(completed)+1)
	}
	for _, r := range recs {
		switch {
		case r.Key == "held":
		case r.State == idemstore.StateInProgress:
		case r.State == idemstore.StateCompleted && r.Response != nil && bytes.Equal(r.Response.Body, bodyFor(r.Key)):
		default:
			t.Fatalf("torn record %s: %+v", r.Key, r)
		}
	}
}

// TestServerRestart kills a private MariaDB under a store in use, as a crash
// would, and starts it again. While it is down every call fails (the store
// is unavailable: no call answers wrongly); once it is back the same store
// works again without being reopened, what was completed before is still
// there, and a lease held across the crash is still held.
func TestServerRestart(t *testing.T) {
	t.Parallel()
	srv := mariadbproc.Start(t)
	dsn := testenv.MySQLDSN(t, srv.URL, "")
	clock := time.Now
	s, err := Open(t.Context(), dsn, &Config{Now: clock, MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := t.Context()
	if _, err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	id := func(key string) idemstore.Identity { i := childID; i.Key = key; return i }
	reserve := func(ctx context.Context, key, token string) (*idemstore.ReserveResult, error) {
		return s.KeyReserve(ctx, &idemstore.ReserveParams{Identity: id(key), Fingerprint: "fp", Token: token,
			Lease: time.Hour, TTL: 24 * time.Hour, LeaseExpiredState: idemstore.StateUnknown})
	}
	for i := range 20 {
		key := fmt.Sprintf("before-%02d", i)
		if res, err := reserve(ctx, key, "t-"+key); err != nil || !res.Reserved {
			t.Fatalf("reserving %s: %+v, %v", key, res, err)
		}
		if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: id(key), Token: "t-" + key,
			Response: &idemstore.Response{Status: 201, Body: bodyFor(key)}}); err != nil {
			t.Fatal(err)
		}
	}
	if res, err := reserve(ctx, "held", "t-held"); err != nil || !res.Reserved {
		t.Fatalf("reserving held: %+v, %v", res, err)
	}

	srv.Kill()
	for _, key := range []string{"during", "before-00", "held"} {
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		res, err := reserve(cctx, key, "t-during")
		cancel()
		if err == nil || errors.Is(err, idemstore.ErrNotFound) {
			t.Fatalf("KeyReserve(%s) with the server down = %+v, %v; want an unavailable store", key, res, err)
		}
	}

	srv.Restart()
	deadline := time.Now().Add(30 * time.Second)
	var res *idemstore.ReserveResult
	for failures := 0; ; failures++ {
		res, err = reserve(ctx, "after", "t-after")
		if err == nil {
			t.Logf("%d failed calls after the restart", failures)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still failing 30 s after the restart: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // the server comes back on real time
	}
	if !res.Reserved {
		t.Fatalf("a new key after the restart: %+v, want reserved", res)
	}
	for i := range 20 {
		key := fmt.Sprintf("before-%02d", i)
		res, err := reserve(ctx, key, "t-again")
		if err != nil || res.Reserved || res.Record.State != idemstore.StateCompleted ||
			res.Record.Response == nil || !bytes.Equal(res.Record.Response.Body, bodyFor(key)) {
			t.Fatalf("%s after the restart: %+v, %v; want its replay", key, res, err)
		}
	}
	if res, err := reserve(ctx, "held", "t-again"); err != nil || res.Reserved || res.Record.Token != "t-held" ||
		res.Record.State != idemstore.StateInProgress {
		t.Fatalf("held after the restart: %+v, %v; want still in progress under t-held", res, err)
	}
	if n, err := s.KeyBacklog(ctx); err != nil || n.Unknown != 0 {
		t.Fatalf("KeyBacklog after the restart = %+v, %v", n, err)
	}
}
