package idemsqlite_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
)

// The process tests run this test binary again as a child that works on a
// database file: IDEMSQLITE_CHILD names what it does, IDEMSQLITE_PATH the
// file.
const (
	childEnv = "IDEMSQLITE_CHILD"
	pathEnv  = "IDEMSQLITE_PATH"
)

// durableBody is the body the "complete" child stores: every byte value.
func durableBody() []byte {
	b := make([]byte, 0, 256*64)
	for range 64 {
		for c := range 256 {
			b = append(b, byte(c))
		}
	}
	return b
}

// bodyFor is the body the "hold" child stores for key.
func bodyFor(key string) []byte {
	return bytes.Repeat([]byte(key+"\x00\xff"), 100)
}

// TestHelperProcess is the child of the process tests; it does nothing when
// run by go test itself.
func TestHelperProcess(t *testing.T) {
	mode := os.Getenv(childEnv)
	if mode == "" {
		return
	}
	ctx := context.Background()
	s, err := idemsqlite.Open(os.Getenv(pathEnv), nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(2)
	}
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(3)
	}
	reserve := func(key, token string) bool {
		res, err := s.KeyReserve(ctx, &idemstore.ReserveParams{
			Identity:    idemstore.Identity{Scope: "tenant", Endpoint: "POST /v1/payments", Key: key},
			Fingerprint: "fp", Token: token, Lease: time.Hour, TTL: 24 * time.Hour,
		})
		if err != nil {
			fail(err)
		}
		return res.Reserved
	}
	complete := func(key, token string, body []byte) {
		err := s.KeyComplete(ctx, &idemstore.CompleteParams{
			Identity: idemstore.Identity{Scope: "tenant", Endpoint: "POST /v1/payments", Key: key},
			Token:    token,
			Response: &idemstore.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/octet-stream"}}, Body: body},
		})
		if err != nil {
			fail(err)
		}
	}

	switch mode {
	case "complete":
		if !reserve("durable", "child-token") {
			fail(fmt.Errorf("durable was not new"))
		}
		complete("durable", "child-token", durableBody())
		s.Close()
		fmt.Println("done")
		os.Exit(0)

	case "hold":
		// Reserve a key and keep it, then complete keys one by one until
		// killed, saying so after each commit.
		if !reserve("held", "child-token") {
			fail(fmt.Errorf("held was not new"))
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
		for g := range 8 {
			wg.Go(func() {
				for k := range 20 {
					key := fmt.Sprintf("k%02d", k)
					if reserve(key, fmt.Sprintf("%d-%d-%s", os.Getpid(), g, key)) {
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

// child starts this test binary as a child in mode on path.
func child(t *testing.T, mode, path string) (*exec.Cmd, io.Reader) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+mode, pathEnv+"="+path)
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

func TestDurableAcrossProcesses(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "idem.db")
	cmd, stdout := child(t, "complete", path)
	out, _ := io.ReadAll(stdout)
	if err := cmd.Wait(); err != nil || strings.TrimSpace(string(out)) != "done" {
		t.Fatalf("child: %v, output %q", err, out)
	}

	s, err := idemsqlite.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r, err := s.KeyGet(t.Context(), idemstore.Identity{Scope: "tenant", Endpoint: "POST /v1/payments", Key: "durable"})
	if err != nil {
		t.Fatalf("KeyGet in the second process: %v", err)
	}
	if r.State != idemstore.StateCompleted || r.Token != "child-token" || r.Response == nil ||
		r.Response.Status != http.StatusCreated || r.Response.Header.Get("Content-Type") != "application/octet-stream" {
		t.Fatalf("record written by the child: %+v", r)
	}
	if !bytes.Equal(r.Response.Body, durableBody()) {
		t.Fatal("the body written by the child came back different")
	}
}

func TestKilledProcess(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "idem.db")
	cmd, stdout := child(t, "hold", path)
	out := lines(stdout)

	// Kill the child in the middle of its writes, once it has committed a
	// few keys.
	var completed []string
	timeout := time.After(30 * time.Second)
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
			t.Fatalf("child completed only %d keys in 30s", len(completed))
		}
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	for line := range out {
		if key, ok := strings.CutPrefix(line, "completed "); ok {
			completed = append(completed, key)
		}
	}

	s, err := idemsqlite.Open(path, nil)
	if err != nil {
		t.Fatalf("Open after the kill: %v", err)
	}
	defer s.Close()
	var check string
	if err := s.DB().QueryRow("PRAGMA integrity_check").Scan(&check); err != nil || check != "ok" {
		t.Fatalf("integrity_check = %q, %v", check, err)
	}
	ctx := t.Context()
	id := idemstore.Identity{Scope: "tenant", Endpoint: "POST /v1/payments"}
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
	// Every record in the file is whole: in progress, or completed with its
	// body.
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

func TestProcessesRace(t *testing.T) {
	t.Parallel()
	// The children also race to create the file and migrate it.
	path := filepath.Join(t.TempDir(), "idem.db")
	const processes = 4
	type result struct {
		out []byte
		err error
	}
	results := make(chan result, processes)
	for range processes {
		cmd, stdout := child(t, "race", path)
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
		case <-time.After(60 * time.Second):
			t.Fatal("children did not finish in 60s")
		}
	}
	for k := range 20 {
		key := fmt.Sprintf("k%02d", k)
		if wins[key] != 1 {
			t.Errorf("%s won %d times across %d processes, want once", key, wins[key], processes)
		}
	}
}
