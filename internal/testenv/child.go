package testenv

import (
	"bufio"
	"os"
	"os/exec"
	"testing"
)

// KillChild runs the test binary again as a child process that runs only
// the test named test, with env ("NAME=value") added to its environment,
// waits until the child prints the line ready on its standard output, then
// kills it (SIGKILL on Unix) and waits for it to exit. The child test is
// one that skips unless its environment variable is set; its standard
// error goes to the parent's. A child that ends without printing ready
// fails the test.
func KillChild(t testing.TB, test string, env []string, ready string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	t.Cleanup(func() {
		if !killed {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	sc := bufio.NewScanner(out)
	for sc.Scan() && sc.Text() != ready {
	}
	if sc.Err() != nil || sc.Text() != ready {
		t.Fatalf("the child %s never printed %q (%v)", test, ready, sc.Err())
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	killed = true
}
