package e2e

import (
	"os/exec"
	"syscall"
)

// setPdeathsig makes the kernel kill cmd when the test binary dies, so a
// crashed test run leaves no server process behind.
func setPdeathsig(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
