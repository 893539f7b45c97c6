package redisproc

import (
	"os/exec"
	"syscall"
)

// setPdeathsig kills the server when the test process dies.
func setPdeathsig(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
