package idem_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// layers is the README's development table: what each library package may
// import from this module (tests may import more). A package not listed
// here, or an import not allowed, fails TestLayout, so the rule lives in
// the code and not only in people's heads. "internal/" stands for the
// foundations under internal/, which import only each other; the
// application under cmd/idem/internal may import anything, and Go's
// internal rule already keeps every library package out of it.
var layers = map[string][]string{
	"idemstore":  {},
	"internal/":  {"internal/"},
	"idem":       {"idemstore", "idemcrypt", "internal/"},
	"idemmem":    {"idemstore", "internal/"},
	"idemsqlite": {"idemstore", "internal/"},
	"idempgx":    {"idemstore", "internal/"},
	"idemredis":  {"idemstore", "internal/"},
	"idemmysql":  {"idemstore", "internal/"},
	"idemcache":  {"idemstore", "internal/"},
	"idemcrypt":  {"idemstore", "internal/"},
	"idemmaint":  {"idemstore", "internal/"},
	"idemtest":   {"idemstore", "idemcrypt", "internal/"},
	"idemprom":   {"idem", "idemstore", "idemmaint", "internal/"},
	"idemotel":   {"idem", "idemstore", "internal/"},
	"idemnats":   {"idem", "idemstore", "internal/"},
	"idemamqp":   {"idem", "idemstore", "internal/"},
	"idemclient": {},
	"idemgrpc":   {"idem", "idemstore", "idemclient", "internal/"},
	"outbox":     {"idemstore", "internal/"},
	// The outbox's broker publishers: packages of their own, so that only
	// a program that uses a broker imports its client.
	"outbox/outboxnats": {"outbox", "idemstore", "internal/"},
	"outbox/outboxamqp": {"outbox", "idemstore", "internal/"},

	// teststore opens a store of each kind for tests (the stores' own
	// tests use testenv, which imports no store).
	"internal/integration/teststore": {"idemstore", "idemmem", "idemsqlite", "idempgx", "idemmysql", "idemredis", "internal/"},
}

const module = "github.com/idem-dev/idem"

// layer names the row of layers that dir (relative to the module root)
// belongs to, or "" for the application.
func layer(dir string) string {
	switch {
	case dir == ".":
		return "idem"
	case strings.HasPrefix(dir, "cmd/"):
		return ""
	case dir == "internal/integration/teststore", strings.HasPrefix(dir, "outbox/"):
		return dir
	case strings.HasPrefix(dir, "internal/"):
		return "internal/"
	}
	return strings.Split(dir, "/")[0]
}

func TestLayout(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	checked := 0
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); p != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		dir := filepath.ToSlash(filepath.Dir(p))
		row := layer(dir)
		if row == "" {
			return nil
		}
		allowed, ok := layers[row]
		if !ok {
			t.Errorf("%s: package directory %s has no row in the layout table (layout_test.go and the README's development section)", p, dir)
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		checked++
		for _, imp := range f.Imports {
			ip, _ := strconv.Unquote(imp.Path.Value)
			if ip != module && !strings.HasPrefix(ip, module+"/") {
				continue
			}
			target := layer(strings.TrimPrefix(strings.TrimPrefix(ip, module), "/"))
			if ip == module {
				target = "idem"
			}
			if target == row && row == "internal/" {
				continue
			}
			if !slices.Contains(allowed, target) {
				t.Errorf("%s imports %s: %s may import only %v (see the README's development section)", p, ip, row, allowed)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("checked the imports of %d files; the walk missed the tree", checked)
	}
	if _, err := os.Stat(path.Join("cmd", "idem", "internal", "cli")); err != nil {
		t.Fatalf("the application is expected under cmd/idem/internal: %v", err)
	}
}
