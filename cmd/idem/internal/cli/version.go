package cli

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// runVersion prints the module's version and the VCS revision the binary
// was built from, as the Go toolchain recorded them (runtime/debug).
func runVersion(_ context.Context, e *env, args []string) error {
	fs := newFlagSet("version", "idem version",
		"Prints the idem module's version, the VCS revision the binary was built from\n"+
			"(with \"+modified\" when the work tree had uncommitted changes) and the Go version.")
	if err := fs.parse(args, e); err != nil {
		return err
	}
	info, _ := debug.ReadBuildInfo()
	writeVersion(e.stdout, info)
	return nil
}

// writeVersion prints info's version lines; info may be nil (a binary
// built without module support).
func writeVersion(w io.Writer, info *debug.BuildInfo) {
	module, version := "github.com/idem-dev/idem/cmd/idem", "unknown"
	revision, at, modified := "unknown", "", false
	if info != nil {
		if info.Main.Path != "" {
			module = info.Main.Path
		}
		if info.Main.Version != "" {
			version = info.Main.Version
		}
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				revision = s.Value
			case "vcs.time":
				at = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	if modified {
		revision += "+modified"
	}
	fmt.Fprintf(w, "idem %s\n  module    %s\n  revision  %s\n", version, module, revision)
	if revision == "unknown" {
		fmt.Fprintf(w, "            (built without VCS information: go build -buildvcs=true in a git clone stamps it)\n")
	}
	if at != "" {
		fmt.Fprintf(w, "  committed %s\n", at)
	}
	fmt.Fprintf(w, "  go        %s\n", runtime.Version())
}
