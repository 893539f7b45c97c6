package idem_test

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// readmeExamples are the files whose examples hold the README's Go
// snippets: example_readme_test.go, and a package's own example where the
// README shows it (its godoc example and the README are then one text).
var readmeExamples = []string{"example_readme_test.go", "../../../idemgrpc/example_test.go"}

// TestReadmeSnippets checks that every Go snippet of the README is, line
// for line, the body of an example in one of readmeExamples between its
// "// README" markers: the README's code compiles, and runs where the
// example has an Output.
func TestReadmeSnippets(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var bodies []string
	for _, name := range readmeExamples {
		examples, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile(`(?s)\t// README\n(.*?)\t// README\n`).FindAllStringSubmatch(string(examples), -1) {
			bodies = append(bodies, dedent(m[1]))
		}
	}
	snippets := regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(string(readme), -1)
	if len(snippets) == 0 {
		t.Fatal("no Go snippet in the README")
	}
	for _, s := range snippets {
		found := false
		for _, b := range bodies {
			if b == s[1] {
				found = true
			}
		}
		if !found {
			t.Errorf("this README snippet is not an example in %v (copy it to example_readme_test.go between // README markers):\n%s", readmeExamples, s[1])
		}
	}
	if len(snippets) != len(bodies) {
		t.Errorf("%d README snippets, %d examples: remove the examples of snippets the README dropped", len(snippets), len(bodies))
	}
}

// dedent removes one leading tab from every line.
func dedent(s string) string {
	lines := strings.SplitAfter(s, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, "\t")
	}
	return strings.Join(lines, "")
}
