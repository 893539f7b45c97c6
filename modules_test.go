package idem_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestModuleFootprint builds, in a module of its own, a program that
// imports only the root package (and idemmem), and one that adds idempgx,
// as a user's would, and counts the modules each lists in `go list -m all`:
// the numbers the README's Install section gives. The second may add only
// this repository's modules and pgx's module graph.
func TestModuleFootprint(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two modules with the go command")
	}
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)only the root package lists ([0-9]+) modules .*?; one that also imports `idempgx` lists ([0-9]+)").FindSubmatch(readme)
	if m == nil {
		t.Fatal("the README's Install section does not give the two module counts")
	}
	wantCore, _ := strconv.Atoi(string(m[1]))
	wantPgx, _ := strconv.Atoi(string(m[2]))
	if wantCore > 5 {
		t.Errorf("the README promises %d modules for the core; the limit is 5", wantCore)
	}

	core := userModule(t, `
		"net/http"

		"github.com/idem-dev/idem"
		"github.com/idem-dev/idem/idemmem"
	`, `_ = idem.New(idemmem.New(nil), nil)(http.NotFoundHandler())`)
	if len(core.modules) != wantCore {
		t.Errorf("a program importing the core lists %d modules, the README says %d:\n%s", len(core.modules), wantCore, strings.Join(core.modules, "\n"))
	}

	pg := userModule(t, `
		"github.com/idem-dev/idem"
		"github.com/idem-dev/idem/idempgx"
	`, `_ = idem.New(idempgx.New(nil, nil), nil)`)
	if len(pg.modules) != wantPgx {
		t.Errorf("a program importing idempgx lists %d modules, the README says %d:\n%s", len(pg.modules), wantPgx, strings.Join(pg.modules, "\n"))
	}
	// What idempgx adds is this repository's or in pgx's graph.
	pgxGraph := map[string]bool{}
	var walk func(string)
	walk = func(mod string) {
		for _, to := range pg.graph[mod] {
			if path := strings.Split(to, "@")[0]; !pgxGraph[path] {
				pgxGraph[path] = true
				walk(to)
			}
		}
	}
	for mod := range pg.graph {
		if strings.HasPrefix(mod, "github.com/jackc/pgx/v5@") {
			pgxGraph["github.com/jackc/pgx/v5"] = true
			walk(mod)
		}
	}
	inCore := map[string]bool{}
	for _, mod := range core.modules {
		inCore[strings.Fields(mod)[0]] = true
	}
	for _, mod := range pg.modules {
		path := strings.Fields(mod)[0]
		if !inCore[path] && !pgxGraph[path] && !strings.HasPrefix(path, "github.com/idem-dev/idem/") {
			t.Errorf("idempgx adds %s, which is neither this repository's nor in pgx's graph", path)
		}
	}
}

type userGraph struct {
	modules []string            // `go list -m all`: the user's own first
	graph   map[string][]string // `go mod graph`: module@version -> requirements
}

// userModule writes a main package with imports and body into a new
// module that takes this repository's modules from their directories, tidies
// it, and returns its module list and graph.
func userModule(t *testing.T, imports, body string) userGraph {
	t.Helper()
	root, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	gomod := "module example.com/user\n\ngo 1.25.0\n\n"
	// The workspace's modules (go.work), each replaced by its directory.
	for _, line := range strings.Split(strings.TrimSpace(goCmd(t, root, "", "list", "-m", "-f", "{{.Path}} {{.Dir}}")), "\n") {
		path, moddir, _ := strings.Cut(line, " ")
		gomod += "replace " + path + " => " + moddir + "\n"
	}
	src := "package main\n\nimport (" + imports + ")\n\nfunc main() { " + body + " }\n"
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	goCmd(t, dir, "off", "mod", "tidy")
	goCmd(t, dir, "off", "build", "-o", os.DevNull, ".")
	var g userGraph
	g.modules = strings.Split(strings.TrimSpace(goCmd(t, dir, "off", "list", "-m", "all")), "\n")
	g.graph = map[string][]string{}
	for _, l := range strings.Split(strings.TrimSpace(goCmd(t, dir, "off", "mod", "graph")), "\n") {
		if from, to, ok := strings.Cut(l, " "); ok {
			g.graph[from] = append(g.graph[from], to)
		}
	}
	return g
}

// goCmd runs the go command in dir, with GOWORK=gowork when that is not
// empty, and returns its standard output.
func goCmd(t *testing.T, dir, gowork string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = os.Environ()
	if gowork != "" {
		cmd.Env = append(cmd.Env, "GOWORK="+gowork, "GOFLAGS=-mod=mod")
	}
	out, err := cmd.Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), dir, err, msg)
	}
	return string(out)
}
