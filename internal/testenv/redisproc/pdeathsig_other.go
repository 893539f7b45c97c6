//go:build !linux

package redisproc

import "os/exec"

func setPdeathsig(*exec.Cmd) {}

// Freeze is not available on this system: it skips the test.
func (s *Server) Freeze() { s.t.Skip("SIGSTOP is not available on this system") }

// Thaw does nothing on this system.
func (s *Server) Thaw() {}
