//go:build !linux

package idemcache

import "os/exec"

func setPdeathsig(*exec.Cmd) {}
