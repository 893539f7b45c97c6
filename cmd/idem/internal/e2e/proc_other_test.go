//go:build !linux

package e2e

import "os/exec"

// setPdeathsig does nothing where the kernel cannot kill orphans for us.
func setPdeathsig(*exec.Cmd) {}
