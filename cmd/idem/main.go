// Command idem makes retried HTTP writes safe; see cmd/idem/internal/cli for its
// subcommands and `idem -h` for its usage.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/idem-dev/idem/cmd/idem/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
