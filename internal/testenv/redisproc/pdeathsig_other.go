//go:build !linux

package redisproc

import "os/exec"

func setPdeathsig(*exec.Cmd) {}
