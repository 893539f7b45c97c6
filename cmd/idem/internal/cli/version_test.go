package cli

import (
	"bytes"
	"runtime/debug"
	"strings"
	"testing"
)

func TestWriteVersion(t *testing.T) {
	t.Parallel()
	info := &debug.BuildInfo{
		Main: debug.Module{Path: "github.com/idem-dev/idem", Version: "v0.3.0"},
		Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "0123456789abcdef"},
			{Key: "vcs.time", Value: "2026-11-26T12:00:00Z"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	var b bytes.Buffer
	writeVersion(&b, info)
	for _, want := range []string{"idem v0.3.0\n", "module    github.com/idem-dev/idem\n", "revision  0123456789abcdef+modified\n", "committed 2026-11-26T12:00:00Z\n", "go        go1."} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("missing %q in:\n%s", want, b.String())
		}
	}
	b.Reset()
	writeVersion(&b, nil)
	if !strings.Contains(b.String(), "idem unknown\n") || !strings.Contains(b.String(), "revision  unknown\n") {
		t.Errorf("without build info:\n%s", b.String())
	}
}
