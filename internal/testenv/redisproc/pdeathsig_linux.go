package redisproc

import (
	"os/exec"
	"syscall"
)

// setPdeathsig kills the server when the test process dies.
func setPdeathsig(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// Freeze stops the server with SIGSTOP: it holds its connections and
// answers nothing, as a replica stuck behind a slow disk or network.
func (s *Server) Freeze() { s.Signal(syscall.SIGSTOP) }

// Thaw resumes a frozen server with SIGCONT.
func (s *Server) Thaw() { s.Signal(syscall.SIGCONT) }
