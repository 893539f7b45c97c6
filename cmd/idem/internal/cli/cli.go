// Package cli is the idem command. Run parses the arguments, dispatches to a
// subcommand and returns the exit code; cmd/idem only wires the process's
// signals and streams to it, so every command is testable in process.
//
// Every flag falls back to an environment variable named after it:
// --scope-header reads IDEM_SCOPE_HEADER when the flag is absent. A flag on
// the command line wins over the variable, the variable over the default; an
// empty variable counts as unset; an invalid value is a usage error that
// names the variable.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"time"
)

// Exit codes of Run.
const (
	ExitOK    = 0 // the command succeeded, or help was asked for
	ExitError = 1 // the command failed
	ExitUsage = 2 // the command line or the environment is invalid
)

// command is one subcommand of idem.
type command struct {
	name    string
	summary string // one line, lower case, for the command list
	// run parses args (the arguments after the command's name) and runs the
	// command until it finishes or ctx ends. A usageError becomes ExitUsage,
	// flag.ErrHelp ExitOK, any other error ExitError.
	run func(ctx context.Context, e *env, args []string) error
}

// commands are the subcommands, in the order usage lists them. A new
// subcommand is a file with its run function and one line here.
var commands = []command{
	{"proxy", "put the idempotency contract in front of any HTTP API", runProxy},
	{"migrate", "apply, revert or list the schema migrations of a SQL store", runMigrate},
	{"keys", "list, show, resolve and purge the records of a store", runKeys},
	{"maintain", "sweep expired leases and reap expired records of a store", runMaintain},
	{"load", "send requests with Idempotency-Keys to a URL and report throughput and latency", runLoad},
	{"payments", "run the reference payments service with its simulated provider", runPayments},
	{"provider", "run the simulated payment provider alone, with a durable ledger", runProvider},
	{"version", "print the module version and the VCS revision of this binary", runVersion},
}

// env is what a command may use of its process.
type env struct {
	stdout, stderr io.Writer
	// lookupEnv reads an environment variable (os.LookupEnv).
	lookupEnv func(string) (string, bool)
	logger    *slog.Logger
	// drainTimeout bounds how long a server waits for in-flight requests
	// once ctx ends.
	drainTimeout time.Duration
	// listening, when set, is told the address a server bound (tests).
	listening func(net.Addr)
}

// defaultDrainTimeout is how long servers drain in-flight requests on
// SIGINT/SIGTERM: as long as an orchestrator's usual grace period (30 s in
// Kubernetes) allows.
const defaultDrainTimeout = 25 * time.Second

// Run runs the idem command with args (without the program name), logging to
// stderr, and returns the process's exit code. Servers stop gracefully when
// ctx ends.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return run(ctx, args, &env{
		stdout:       stdout,
		stderr:       stderr,
		lookupEnv:    os.LookupEnv,
		logger:       slog.New(slog.NewTextHandler(stderr, nil)),
		drainTimeout: defaultDrainTimeout,
	})
}

func run(ctx context.Context, args []string, e *env) int {
	if len(args) == 0 {
		printCommands(e.stderr)
		return ExitUsage
	}
	name, rest := args[0], args[1:]
	switch name {
	case "-h", "-help", "--help":
		printCommands(e.stdout)
		return ExitOK
	case "help":
		if len(rest) == 0 {
			printCommands(e.stdout)
			return ExitOK
		}
		name, rest = rest[0], []string{"-h"}
	}
	var cmd *command
	for i := range commands {
		if commands[i].name == name {
			cmd = &commands[i]
		}
	}
	if cmd == nil {
		fmt.Fprintf(e.stderr, "idem: unknown command %q\n\n", name)
		printCommands(e.stderr)
		return ExitUsage
	}
	err := cmd.run(ctx, e, rest)
	var uerr usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return ExitOK
	case errors.As(err, &uerr):
		fmt.Fprintf(e.stderr, "idem %s: %v\nRun 'idem %s --help' for usage.\n", cmd.name, err, cmd.name)
		return ExitUsage
	default:
		fmt.Fprintf(e.stderr, "idem %s: %v\n", cmd.name, err)
		return ExitError
	}
}

func printCommands(w io.Writer) {
	fmt.Fprint(w, "idem makes retried HTTP writes safe.\n\nUsage: idem COMMAND [flags]\n\nCommands:\n")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, "\nRun 'idem COMMAND --help' for a command's flags.\n")
}

// usageError is an invalid command line or environment: ExitUsage.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usageErrorf(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}
