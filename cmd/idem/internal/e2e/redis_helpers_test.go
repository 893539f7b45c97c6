package e2e

import (
	"bufio"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idem-dev/idem/cmd/idem/internal/idembin"
	"github.com/idem-dev/idem/internal/testenv"
)

// redisServer is a redis-server process of the test's own on a loopback
// port, without persistence (--save "" --appendonly no): killing it loses
// every record, as a crash of an unpersisted Redis does.
type redisServer struct {
	t    *testing.T
	path string // of redis-server
	dir  string // its working directory
	port int
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// startRedisServer starts redis-server on a free loopback port and waits
// until it answers PING. It skips the test (fails it under
// IDEM_TEST_REQUIRE_ALL=1) when redis-server is not installed. The server
// is killed when the test ends.
func startRedisServer(t *testing.T) *redisServer {
	t.Helper()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		testenv.Unavailable(t, "redis-server is not in PATH: %v; install Redis to run the Redis end-to-end tests", err)
		return nil
	}
	r := &redisServer{t: t, path: path, dir: t.TempDir()}
	t.Cleanup(r.Kill)
	// The free port is found by binding it and letting it go: another
	// process may take it in between, so a failed start tries another one.
	for attempt := 0; ; attempt++ {
		r.port = freePort(t)
		if err := r.start(); err == nil {
			return r
		} else if attempt == 2 {
			t.Fatal(err)
		}
	}
}

// URL is the --store URL of the server.
func (r *redisServer) URL() string {
	return fmt.Sprintf("redis://127.0.0.1:%d/0", r.port)
}

func (r *redisServer) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// start runs redis-server on r.port and waits up to 10 s for it to answer.
func (r *redisServer) start() error {
	cmd := exec.Command(r.path, "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", r.dir, "--daemonize", "no", "--loglevel", "warning")
	setPdeathsig(cmd)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting redis-server: %w", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	r.cmd, r.done = cmd, done
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := ping(r.addr()); err == nil {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("redis-server on port %d exited at start: %s", r.port, out.String())
		default:
		}
		if time.Now().After(deadline) {
			r.Kill()
			return fmt.Errorf("redis-server on port %d did not answer within 10s: %s", r.port, out.String())
		}
		time.Sleep(20 * time.Millisecond) // the server starts on real time
	}
}

// Restart starts the server again on the same port, after Kill.
func (r *redisServer) Restart() {
	r.t.Helper()
	if err := r.start(); err != nil {
		r.t.Fatal(err)
	}
}

// Kill sends SIGKILL and waits until the process is gone. It does nothing
// when the server is not running.
func (r *redisServer) Kill() {
	if r.cmd == nil {
		return
	}
	select {
	case <-r.done:
		return
	default:
	}
	r.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-r.done:
	case <-time.After(30 * time.Second):
		r.t.Errorf("redis-server on port %d survived SIGKILL for 30s", r.port)
	}
}

// ping sends PING to the Redis at addr and wants +PONG.
func ping(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startRedisProxy starts `idem proxy` in front of upstream on the Redis.
func startRedisProxy(t *testing.T, name, upstream string, r *redisServer, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(idembin.Path(t), append([]string{"proxy",
		"--listen", "127.0.0.1:0", "--upstream", upstream, "--store", r.URL()}, args...)...)
	cmd.Env = idembin.Environ()
	return start(t, name, cmd)
}
