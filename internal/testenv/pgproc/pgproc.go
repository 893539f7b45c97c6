// Package pgproc starts private PostgreSQL clusters for tests: a primary in
// a temporary directory on a free loopback port, and streaming standbys of
// it, which a test may crash (pg_ctl stop -m immediate), restart, stop
// (SIGSTOP, a stalled server) and promote without touching the shared
// PostgreSQL.
//
// A test that calls Start skips (fails under IDEM_TEST_REQUIRE_ALL=1) when
// initdb is not in /usr/lib/postgresql/*/bin or on PATH, or when it runs as
// root without a postgres user to run the server as.
package pgproc

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/testenv"
)

// Cluster is one PostgreSQL server: a primary, or a standby of one.
type Cluster struct {
	// Port is its loopback port; URL connects to its postgres database as
	// the postgres superuser.
	Port int
	URL  string

	t      testing.TB
	bin    string   // directory of initdb, pg_ctl, pg_basebackup
	dir    string   // the temporary directory, also the socket directory
	asUser []string // command prefix that runs as the cluster's owner
	uid    int      // the owner, when the tests run as root
	gid    int

	// mu serializes Start and Crash: a fault campaign heals one crash
	// (Start) in its own goroutine while it may inject the next (Crash).
	mu sync.Mutex
}

// Start creates a primary with the newest PostgreSQL of
// /usr/lib/postgresql (or that of PATH), with conf appended to its
// postgresql.conf, starts it and stops it when the test ends.
func Start(t testing.TB, conf ...string) *Cluster {
	t.Helper()
	c := newCluster(t)
	if c == nil {
		return nil
	}
	c.run("initdb", "-D", c.Data(), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C", "--no-sync")
	c.appendConf(conf...)
	c.Start()
	return c
}

func newCluster(t testing.TB) *Cluster {
	t.Helper()
	c := &Cluster{t: t}
	if found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb"); len(found) > 0 {
		slices.SortFunc(found, func(a, b string) int { return versionOf(a) - versionOf(b) })
		c.bin = filepath.Dir(found[len(found)-1])
	} else if p, err := exec.LookPath("initdb"); err == nil {
		c.bin = filepath.Dir(p)
	} else {
		testenv.Unavailable(t, "initdb not found in /usr/lib/postgresql/*/bin or PATH: cannot start a private PostgreSQL")
		return nil
	}
	dir, err := os.MkdirTemp("", "idem-pg-")
	if err != nil {
		t.Fatal(err)
	}
	c.dir = dir
	t.Cleanup(func() { os.RemoveAll(dir) })
	if os.Geteuid() == 0 {
		// initdb and postgres refuse to run as root.
		runuser, err := exec.LookPath("runuser")
		if err != nil {
			testenv.Unavailable(t, "running as root without runuser: cannot run PostgreSQL as another user")
			return nil
		}
		u, err := user.Lookup("postgres")
		if err != nil {
			testenv.Unavailable(t, "running as root without a postgres user to run PostgreSQL as: %v", err)
			return nil
		}
		c.uid, _ = strconv.Atoi(u.Uid)
		c.gid, _ = strconv.Atoi(u.Gid)
		if err := os.Chown(dir, c.uid, c.gid); err != nil {
			t.Fatal(err)
		}
		c.asUser = []string{runuser, "-u", "postgres", "--"}
	}
	port, err := testenv.ServerPort()
	if err != nil {
		t.Fatal(err)
	}
	c.Port = port
	c.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.Port)
	t.Cleanup(func() {
		// It fails when the test left the cluster stopped.
		argv := c.command("pg_ctl", "-D", c.Data(), "-m", "immediate", "-w", "stop")
		c.Signal(syscall.SIGCONT)
		exec.Command(argv[0], argv[1:]...).Run()
	})
	return c
}

// versionOf returns the major version in a /usr/lib/postgresql/N/bin path.
func versionOf(path string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(path))))
	return n
}

// Data is the cluster's data directory.
func (c *Cluster) Data() string { return filepath.Join(c.dir, "data") }

func (c *Cluster) command(name string, args ...string) []string {
	return append(append(slices.Clone(c.asUser), filepath.Join(c.bin, name)), args...)
}

func (c *Cluster) run(name string, args ...string) {
	c.t.Helper()
	argv := c.command(name, args...)
	if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
		c.t.Fatalf("%s: %v\n%s\n%s", name, err, out, c.logTail())
	}
}

// logTail returns the last lines of the server's log, to say why a
// command failed.
func (c *Cluster) logTail() string {
	lines, err := c.lastLogLines(15)
	if err != nil {
		return "the server's log: " + err.Error()
	}
	return "the server's log ends:\n" + lines
}

// appendConf appends lines to postgresql.conf (read at the next start or
// reload).
func (c *Cluster) appendConf(lines ...string) {
	c.t.Helper()
	if len(lines) == 0 {
		return
	}
	f, err := os.OpenFile(filepath.Join(c.Data(), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		c.t.Fatal(err)
	}
	_, err = fmt.Fprintln(f, strings.Join(lines, "\n"))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		c.t.Fatal(err)
	}
}

// Configure appends lines to postgresql.conf and reloads the server.
func (c *Cluster) Configure(lines ...string) {
	c.t.Helper()
	c.appendConf(lines...)
	c.run("pg_ctl", "-D", c.Data(), "reload")
}

// Start starts the server and waits until it accepts connections. It does
// nothing when the server runs already.
func (c *Cluster) Start() {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running() {
		return
	}
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=40 -c shared_buffers=16MB", c.Port, c.dir)
	argv := c.command("pg_ctl", "-D", c.Data(), "-l", filepath.Join(c.dir, "server.log"), "-o", opts, "-w", "-t", "60", "start")
	// pg_ctl can give up on a start right after a crash (seen on a loaded
	// machine: "stopped waiting") while the server it launched goes on and
	// accepts connections; a start that failed is tried again only when no
	// server runs.
	var out []byte
	var err error
	for try := range 3 {
		if try > 0 {
			time.Sleep(time.Second)
		}
		if out, err = exec.Command(argv[0], argv[1:]...).CombinedOutput(); err == nil {
			return
		}
		if c.waitRunning(10 * time.Second) {
			return
		}
	}
	c.t.Fatalf("pg_ctl: %v\n%s\n%s", err, out, c.logTail())
}

// running reports whether the server's postmaster runs (pg_ctl status).
func (c *Cluster) running() bool {
	argv := c.command("pg_ctl", "-D", c.Data(), "status")
	return exec.Command(argv[0], argv[1:]...).Run() == nil
}

// waitRunning waits up to d for the server to run and accept connections
// (pg_isready).
func (c *Cluster) waitRunning(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if c.running() {
			argv := c.command("pg_isready", "-q", "-h", "127.0.0.1", "-p", strconv.Itoa(c.Port))
			if exec.Command(argv[0], argv[1:]...).Run() == nil {
				return true
			}
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Crash stops the server at once, as a crash would: connections are cut
// and nothing is flushed or checkpointed.
// It does nothing when the server is down already (a fault campaign's
// crashes may overlap).
func (c *Cluster) Crash() {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.running() {
		return
	}
	c.Signal(syscall.SIGCONT) // a stopped server cannot shut down
	c.run("pg_ctl", "-D", c.Data(), "-m", "immediate", "-w", "stop")
}

// StartStandby makes a streaming standby of c (pg_basebackup -R), with conf
// appended to its postgresql.conf, and starts it. It replicates from
// the address via (host:port; "" is c itself), which may be a relay in
// front of c. Its application_name is name, for
// synchronous_standby_names.
func (c *Cluster) StartStandby(name, via string, conf ...string) *Cluster {
	c.t.Helper()
	s := newCluster(c.t)
	if s == nil {
		return nil
	}
	s.bin = c.bin
	host, port := "127.0.0.1", strconv.Itoa(c.Port)
	if via != "" {
		var err error
		if host, port, err = net.SplitHostPort(via); err != nil {
			c.t.Fatal(err)
		}
	}
	s.run("pg_basebackup", "-D", s.Data(), "-R", "-X", "stream", "-c", "fast",
		"-h", host, "-p", port, "-U", "postgres", "-d",
		fmt.Sprintf("application_name=%s", name))
	s.appendConf(conf...)
	s.Start()
	return s
}

// Promote turns a standby into a primary (pg_ctl promote) and waits until
// it is one.
func (c *Cluster) Promote() {
	c.t.Helper()
	c.run("pg_ctl", "-D", c.Data(), "-w", "promote")
}

// Signal sends sig to the server and every process it forked (SIGSTOP: a
// stalled server, SIGCONT: it goes on). It does nothing when the server
// is not running.
func (c *Cluster) Signal(sig syscall.Signal) {
	b, err := os.ReadFile(filepath.Join(c.Data(), "postmaster.pid"))
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	if err != nil {
		return
	}
	pids := []int{pid}
	if kids, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid)); err == nil {
		for _, f := range strings.Fields(string(kids)) {
			if n, err := strconv.Atoi(f); err == nil {
				pids = append(pids, n)
			}
		}
	}
	for _, p := range pids {
		syscall.Kill(p, sig)
	}
}

// Log returns the last lines of the server's log.
func (c *Cluster) Log() string {
	lines, err := c.lastLogLines(20)
	if err != nil {
		return err.Error()
	}
	return lines
}

// lastLogLines returns the last n lines of the server's log.
func (c *Cluster) lastLogLines(n int) (string, error) {
	b, err := os.ReadFile(filepath.Join(c.dir, "server.log"))
	if err != nil {
		return "", err
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n"), nil
}
