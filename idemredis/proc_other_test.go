//go:build !linux

package idemredis

import "os/exec"

func setPdeathsig(*exec.Cmd) {}
