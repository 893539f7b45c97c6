// Package idembin builds the idem command for the tests that run it as a
// process (the e2e and chaos suites): once per test binary, with -race
// when the tests are, so the processes are checked for races too and the
// build reuses the test build's cache.
package idembin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/idem-dev/idem/internal/testenv"
)

var (
	once sync.Once
	dir  string // holds the built command
	path string
	err  error
)

// Path builds github.com/idem-dev/idem/cmd/idem on its first call and
// returns the path of the built command; it fails the test when the build
// fails. TestMain calls Remove once the tests have run.
func Path(t testing.TB) string {
	t.Helper()
	once.Do(func() {
		if dir, err = os.MkdirTemp("", "idem-bin-"); err != nil {
			return
		}
		path = filepath.Join(dir, "idem")
		goTool, lookErr := exec.LookPath("go")
		if lookErr != nil {
			goTool = "/usr/local/go/bin/go" // where this machine's Go lives
		}
		args := []string{"build", "-o", path}
		if testenv.RaceEnabled {
			args = append(args, "-race")
		}
		cmd := exec.Command(goTool, append(args, "github.com/idem-dev/idem/cmd/idem")...)
		if output, buildErr := cmd.CombinedOutput(); buildErr != nil {
			err = fmt.Errorf("go build ./cmd/idem: %v\n%s", buildErr, output)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// Remove deletes the built command, if any.
func Remove() {
	if dir != "" {
		os.RemoveAll(dir)
	}
}

// Environ is the test's environment without IDEM_* variables, which would
// configure the processes behind the test's back.
func Environ() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "IDEM_") {
			out = append(out, kv)
		}
	}
	return out
}
