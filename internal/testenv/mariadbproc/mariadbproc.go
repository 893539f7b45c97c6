// Package mariadbproc starts private MariaDB servers for tests that stop,
// kill or restart their database: each lives in a temporary directory,
// listens on a free loopback port, holds a database named test that root
// reaches without a password, and is killed when the test ends. The shared
// test server must never be restarted; these may.
//
// A test that calls Start skips (fails under IDEM_TEST_REQUIRE_ALL=1) when
// mariadbd (or mysqld) and mariadb-install-db (or mysql_install_db) are not
// on PATH or in /usr/sbin.
package mariadbproc

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/testenv"
)

// Server is a private mariadbd child process.
type Server struct {
	// Port is its loopback TCP port; Dir its data, socket and logs.
	Port int
	Dir  string
	// URL is mysql://root@127.0.0.1:PORT/test.
	URL string

	t    testing.TB
	bin  string
	cmd  *exec.Cmd
	done chan struct{}
}

// find returns the path of the first of names found on PATH or in
// /usr/sbin and /usr/bin.
func find(names ...string) string {
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
		for _, dir := range []string{"/usr/sbin", "/usr/bin"} {
			if p := filepath.Join(dir, n); isFile(p) {
				return p
			}
		}
	}
	return ""
}

func isFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

// Start creates a data directory with mariadb-install-db, starts mariadbd
// on it and waits until it accepts connections.
func Start(t testing.TB) *Server {
	t.Helper()
	bin := find("mariadbd", "mysqld")
	install := find("mariadb-install-db", "mysql_install_db")
	if bin == "" || install == "" {
		testenv.Unavailable(t, "mariadbd and mariadb-install-db not found: cannot start a private MariaDB")
		return nil
	}
	dir, err := os.MkdirTemp("", "idem-mariadb-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	s := &Server{Dir: dir, t: t, bin: bin}
	out, err := exec.Command(install, "--no-defaults", "--datadir="+s.data(), "--user="+currentUser(),
		"--auth-root-authentication-method=normal", "--skip-test-db").CombinedOutput()
	if err != nil {
		t.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}
	if err := os.WriteFile(filepath.Join(dir, "init.sql"), []byte("CREATE DATABASE IF NOT EXISTS test;\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for attempt := 0; ; attempt++ {
		port, err := testenv.ServerPort()
		if err != nil {
			t.Fatal(err)
		}
		s.Port = port
		s.URL = fmt.Sprintf("mysql://root@127.0.0.1:%d/test", port)
		if err = s.start(); err == nil {
			break
		}
		if attempt == 2 {
			t.Fatal(err)
		}
	}
	t.Cleanup(s.Kill)
	return s
}

func currentUser() string {
	if os.Geteuid() == 0 {
		return "root" // mariadbd refuses root unless told so
	}
	if u := os.Getenv("USER"); u != "" {
		return u
	}
	return strconv.Itoa(os.Geteuid())
}

func (s *Server) data() string { return filepath.Join(s.Dir, "data") }

// start runs mariadbd on s's data directory and port and waits up to 60 s
// until the port accepts connections.
func (s *Server) start() error {
	cmd := exec.Command(s.bin, "--no-defaults",
		"--datadir="+s.data(), "--user="+currentUser(),
		"--port="+strconv.Itoa(s.Port), "--bind-address=127.0.0.1",
		"--socket="+filepath.Join(s.Dir, "mariadb.sock"),
		"--pid-file="+filepath.Join(s.Dir, "mariadb.pid"),
		"--log-error="+filepath.Join(s.Dir, "error.log"),
		"--init-file="+filepath.Join(s.Dir, "init.sql"),
		"--innodb-buffer-pool-size=32M", "--innodb-log-file-size=16M",
		"--max-connections=100", "--skip-log-bin", "--skip-name-resolve")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	s.cmd, s.done = cmd, done
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-done:
			log, _ := os.ReadFile(filepath.Join(s.Dir, "error.log"))
			return fmt.Errorf("mariadbd exited at start (%v):\n%s", cmd.ProcessState, log)
		default:
		}
		if c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port)), time.Second); err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			s.Kill()
			return errors.New("mariadbd did not accept connections within 60s")
		}
		time.Sleep(50 * time.Millisecond) // the server comes up on real time
	}
}

// Kill kills the server with SIGKILL, as a crash would, and waits for it
// to exit. Killing a server that is not running does nothing.
func (s *Server) Kill() {
	if s.cmd == nil {
		return
	}
	select {
	case <-s.done:
		return
	default:
	}
	s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.done
}

// Restart starts the server again on its data directory and port after
// Kill: InnoDB recovers what was committed.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	if err := s.start(); err != nil {
		s.t.Fatal(err)
	}
}
