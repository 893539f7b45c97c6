//go:build linux

package chaos

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idem-dev/idem/cmd/idem/internal/idembin"
	"github.com/idem-dev/idem/internal/testenv"
)

var (
	helpOnce sync.Once
	helpText string
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	code := m.Run()
	idembin.Remove()
	os.Exit(code)
}

// proxyHasFlag reports whether `idem proxy --help` lists the flag: the
// campaign uses flags of later versions only when the binary has them.
func proxyHasFlag(t *testing.T, flag string) bool {
	t.Helper()
	helpOnce.Do(func() {
		out, _ := exec.Command(idembin.Path(t), "proxy", "--help").CombinedOutput()
		helpText = string(out)
	})
	return strings.Contains(helpText, "-"+flag+" ")
}

// proc is a server process the campaign kills, stops and restarts: it
// listens on the same port every time, its output appended to one log.
type proc struct {
	t    *testing.T
	name string
	argv []string // the program and its arguments, without --listen
	env  []string
	port int
	log  string

	// life serializes starts and kills: two faults on one proxy overlap
	// (a kill's restart beside another kill's), and two starts at once
	// left one process holding the port while the other was tracked.
	life sync.Mutex
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

func newProc(t *testing.T, name, logPath string, env []string, argv ...string) *proc {
	// Below the ephemeral range (testenv.ServerPort): while the proxy is
	// down, another connection could take a port from that range as its
	// source port, and the restart would not bind it.
	port, err := testenv.ServerPort()
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, name: name, argv: argv, env: env, port: port, log: logPath}
	t.Cleanup(p.kill)
	return p
}

// URL is the process's base URL.
func (p *proc) URL() string { return "http://127.0.0.1:" + strconv.Itoa(p.port) }

// start starts the process and waits until it accepts connections. A
// process that exits first (its store is down at start) is started again
// until the deadline. A process already running is left as it is.
func (p *proc) start(within time.Duration) error {
	p.life.Lock()
	defer p.life.Unlock()
	if p.running() {
		return nil
	}
	deadline := time.Now().Add(within)
	for {
		err := p.startOnce(deadline)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(200 * time.Millisecond) // the store comes back on real time
	}
}

func (p *proc) startOnce(deadline time.Time) error {
	logf, err := os.OpenFile(p.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "---- %s: starting %s\n", time.Now().Format("15:04:05.000"), p.name)
	args := append(append([]string(nil), p.argv[1:]...), "--listen", "127.0.0.1:"+strconv.Itoa(p.port))
	cmd := exec.Command(p.argv[0], args...)
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	p.mu.Lock()
	p.cmd, p.done = cmd, done
	p.mu.Unlock()
	for {
		conn, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(p.port), time.Second)
		if err == nil {
			conn.Close()
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("%s exited at start (see %s)", p.name, p.log)
		case <-time.After(20 * time.Millisecond): // the process starts on real time
		}
		if time.Now().After(deadline) {
			p.stop()
			return fmt.Errorf("%s did not listen on port %d in time (see %s)", p.name, p.port, p.log)
		}
	}
}

// kill sends SIGKILL (after SIGCONT, so a stopped process dies too) and
// waits until the process is gone.
func (p *proc) kill() {
	p.life.Lock()
	defer p.life.Unlock()
	p.stop()
}

// stop kills the running process, if any, and waits for it to exit. The
// caller holds p.life.
func (p *proc) stop() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Process.Signal(syscall.SIGCONT)
	<-done
}

// signal sends sig to the running process.
func (p *proc) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return errors.New("not started")
	}
	return p.cmd.Process.Signal(sig)
}

// running reports whether the process is alive.
func (p *proc) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// output returns the process's log.
func (p *proc) output() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}
