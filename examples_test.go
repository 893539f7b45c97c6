package idem_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestEveryPackageHasAnExample: every library package (not internal, not
// the command) has a runnable example in a file the README's table links,
// so pkg.go.dev and the README show the same entry points.
func TestEveryPackageHasAnExample(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	linked := map[string]bool{}
	for _, m := range regexp.MustCompile(`\]\(([a-z_/]*example[a-z_]*_test\.go)\)`).FindAllSubmatch(readme, -1) {
		linked[string(m[1])] = true
	}
	dirs := []string{"."}
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), "idem") || e.Name() == "outbox" {
			dirs = append(dirs, e.Name())
		}
	}
	for _, dir := range dirs {
		files, _ := filepath.Glob(filepath.Join(dir, "*_test.go"))
		found := false
		for _, f := range files {
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if regexp.MustCompile(`(?m)^func Example`).Match(src) && linked[filepath.ToSlash(f)] {
				found = true
			}
		}
		if !found {
			t.Errorf("package %s has no example in a file the README's examples table links", dir)
		}
	}
}
