package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/idem-dev/idem/internal/testenv"
)

// cluster is a private PostgreSQL cluster in a temporary directory, which
// a test may stop and start (the shared test database must not be).
type cluster struct {
	t      *testing.T
	bin    string   // directory of initdb and pg_ctl
	dir    string   // the temporary directory, also the socket directory
	asUser []string // command prefix that runs as the cluster's owner
	port   int
	// URL is the cluster's connection URL.
	URL string
}

// newCluster creates and starts a private cluster with the PostgreSQL
// binaries of /usr/lib/postgresql (the newest) or of PATH. It skips (fails
// under IDEM_TEST_REQUIRE_ALL=1) when there is no initdb, or when the tests
// run as root and there is no postgres user to run it as. The cluster is
// stopped and removed when the test ends.
func newCluster(t *testing.T) *cluster {
	t.Helper()
	c := &cluster{t: t}
	if found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb"); len(found) > 0 {
		slices.SortFunc(found, func(a, b string) int { return versionOf(a) - versionOf(b) })
		c.bin = filepath.Dir(found[len(found)-1])
	} else if p, err := exec.LookPath("initdb"); err == nil {
		c.bin = filepath.Dir(p)
	} else {
		testenv.Unavailable(t, "initdb not found in /usr/lib/postgresql/*/bin or PATH: cannot start a private PostgreSQL")
		return nil
	}
	dir, err := os.MkdirTemp("", "idem-e2e-pg-")
	if err != nil {
		t.Fatal(err)
	}
	c.dir = dir
	t.Cleanup(func() { os.RemoveAll(dir) })
	if os.Geteuid() == 0 {
		// initdb refuses to run as root.
		runuser, err := exec.LookPath("runuser")
		if err != nil {
			testenv.Unavailable(t, "running as root without runuser: cannot run initdb as another user")
			return nil
		}
		u, err := user.Lookup("postgres")
		if err != nil {
			testenv.Unavailable(t, "running as root without a postgres user to run initdb as: %v", err)
			return nil
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
		c.asUser = []string{runuser, "-u", "postgres", "--"}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c.port = ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	c.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)

	c.run("initdb", "-D", c.data(), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C", "--no-sync")
	c.Start()
	t.Cleanup(func() {
		// It fails when the test left the cluster stopped.
		argv := c.command("pg_ctl", "-D", c.data(), "-m", "immediate", "-w", "stop")
		exec.Command(argv[0], argv[1:]...).Run()
	})
	return c
}

// versionOf returns the major version in a /usr/lib/postgresql/N/bin path.
func versionOf(path string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(path))))
	return n
}

func (c *cluster) data() string { return filepath.Join(c.dir, "data") }

// command returns the argv that runs the named PostgreSQL program as the
// cluster's owner.
func (c *cluster) command(name string, args ...string) []string {
	return append(append(slices.Clone(c.asUser), filepath.Join(c.bin, name)), args...)
}

func (c *cluster) run(name string, args ...string) {
	c.t.Helper()
	argv := c.command(name, args...)
	if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
		c.t.Fatalf("%s: %v\n%s", name, err, out)
	}
}

// Start starts the cluster and waits until it accepts connections.
func (c *cluster) Start() {
	c.t.Helper()
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=20 -c shared_buffers=16MB", c.port, c.dir)
	c.run("pg_ctl", "-D", c.data(), "-l", filepath.Join(c.dir, "server.log"), "-o", opts, "-w", "-t", "60", "start")
}

// Stop stops the cluster at once, as a crash would: connections are cut
// and nothing is flushed.
func (c *cluster) Stop() {
	c.t.Helper()
	c.run("pg_ctl", "-D", c.data(), "-m", "immediate", "-w", "stop")
}
