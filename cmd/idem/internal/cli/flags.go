package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idem-dev/idem/internal/redact"
)

// flagSet is a subcommand's flags with its usage text.
type flagSet struct {
	*flag.FlagSet
	synopsis  string // e.g. "idem proxy --upstream URL [flags]"
	about     string // a paragraph on what the command does
	logLevel  string
	logFormat string
}

// Log settings every command takes.
const (
	defaultLogLevel  = "info"
	defaultLogFormat = "text"
)

// newFlagSet returns a flagSet with the log flags every command takes
// (--log-level, --log-format). It prints nothing itself: parse returns the
// errors and prints the help asked for.
func newFlagSet(name, synopsis, about string) *flagSet {
	fs := flag.NewFlagSet("idem "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	f := &flagSet{FlagSet: fs, synopsis: synopsis, about: about, logLevel: defaultLogLevel, logFormat: defaultLogFormat}
	fs.Var(oneOfValue{&f.logLevel, []string{"debug", "info", "warn", "error"}}, "log-level",
		"`LEVEL` of the log on stderr: debug, info (at most one line per request), warn or error")
	fs.Var(oneOfValue{&f.logFormat, []string{"text", "json"}}, "log-format", "`FORMAT` of the log on stderr: text (logfmt) or json")
	return f
}

// applyLog replaces e.logger when --log-level or --log-format (or their
// variables) differ from the defaults.
func (fs *flagSet) applyLog(e *env) {
	if fs.logLevel == defaultLogLevel && fs.logFormat == defaultLogFormat {
		return
	}
	var level slog.Level
	level.UnmarshalText([]byte(fs.logLevel)) // checked by the flag
	opts := &slog.HandlerOptions{Level: level}
	if fs.logFormat == "json" {
		e.logger = slog.New(slog.NewJSONHandler(e.stderr, opts))
	} else {
		e.logger = slog.New(slog.NewTextHandler(e.stderr, opts))
	}
}

// envName is the environment variable a flag falls back to, for the flags
// that mean the same in every command (--store, --ops-listen, …).
func envName(flagName string) string {
	return "IDEM_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// commandScoped are the flags whose meaning differs between commands: their
// variable carries the command's name (IDEM_PROXY_LISTEN, IDEM_LOAD_BODY),
// so that one exported in a shell for one command is never read by
// another. The unscoped name (IDEM_LISTEN) is refused with the scoped one
// in the message.
var commandScoped = map[string]bool{
	"listen": true, // payments, proxy and provider each serve on their own
	"body":   true, // load's request body; keys resolve's stored response body
	"header": true, // load's request headers; keys resolve's stored response headers
}

// envName is the environment variable flag falls back to in this command.
func (fs *flagSet) envName(flag string) string {
	if !commandScoped[flag] {
		return envName(flag)
	}
	cmd := strings.TrimPrefix(fs.Name(), "idem ")
	cmd, _, _ = strings.Cut(cmd, " ")
	return envName(cmd + "-" + flag)
}

// parse parses args, then sets every flag absent from them from its
// environment variable, when that is set and not empty. -h prints the usage
// to stdout and returns flag.ErrHelp; other errors are usageErrors. Positional
// arguments are refused.
//
// A value echoed in an error goes through redact.URL, so a URL or a
// connection string shows without its password; a flag whose value
// implements hiddenValue is not echoed at all.
func (fs *flagSet) parse(args []string, e *env) error {
	if err := fs.parseRedacted(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.printUsage(e.stdout)
			return flag.ErrHelp
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageErrorf("unexpected argument %q", redact.URL(fs.Arg(0)))
	}
	given := make(map[string]bool)
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] || err != nil {
			return
		}
		name := fs.envName(f.Name)
		if generic := envName(f.Name); generic != name {
			if v, ok := e.lookupEnv(generic); ok && v != "" {
				err = usageErrorf("%s is set, but --%s means something else in each command: set %s instead", generic, f.Name, name)
				return
			}
		}
		v, ok := e.lookupEnv(name)
		if !ok || v == "" {
			return
		}
		if serr := f.Value.Set(v); serr != nil {
			err = usageErrorf("invalid value %s for %s: %v", shown(f.Value, v), name, serr)
		}
	})
	if err == nil {
		fs.applyLog(e)
	}
	return err
}

// hiddenValue is a flag value never shown in an error (a token, a header
// value that carries a credential).
type hiddenValue interface{ hidden() }

// shown is how an error shows the value s of flag value v.
func shown(v flag.Value, s string) string {
	if _, ok := v.(hiddenValue); ok {
		return "(hidden)"
	}
	return strconv.Quote(redact.URL(s))
}

// parseRedacted is fs.Parse, except that a value refused by its flag is shown
// redacted: the flag package would quote it as given.
func (fs *flagSet) parseRedacted(args []string) error {
	var failed *setFailure
	fs.VisitAll(func(f *flag.Flag) {
		g := guardedValue{Value: f.Value, name: f.Name, failed: &failed}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			f.Value = guardedBool{g}
		} else {
			f.Value = g
		}
	})
	defer fs.VisitAll(func(f *flag.Flag) {
		switch v := f.Value.(type) {
		case guardedValue:
			f.Value = v.Value
		case guardedBool:
			f.Value = v.Value
		}
	})
	err := fs.Parse(args)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return err
	case failed != nil:
		return fmt.Errorf("invalid value %s for --%s: %v", shown(failed.value, failed.s), failed.name, failed.err)
	}
	// The flag package names flags with one dash, as Go's own tools take
	// them; idem's help and README spell them with two.
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		if near := fs.nearest(name); near != "" {
			return fmt.Errorf("unknown flag --%s; did you mean --%s?", name, near)
		}
		return fmt.Errorf("unknown flag --%s", name)
	}
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
		return fmt.Errorf("flag --%s needs a value", name)
	}
	return err
}

// nearest returns the flag of fs whose name is closest to name, when it is
// close enough to be what was meant (one edit in a name of 3 or more
// characters, two in one of 6 or more); "" otherwise.
func (fs *flagSet) nearest(name string) string {
	best, bestDist := "", 3
	fs.VisitAll(func(f *flag.Flag) { // in lexical order: ties go to the first
		if d := editDistance(name, f.Name); d < bestDist && d*3 <= len(name) {
			best, bestDist = f.Name, d
		}
	})
	return best
}

// editDistance is the optimal string alignment distance between a and b:
// the insertions, deletions, substitutions and transpositions of adjacent
// bytes that turn a into b.
func editDistance(a, b string) int {
	// d[i][j] is the distance between a[:i] and b[:j].
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// setFailure is the first value a flag refused during parseRedacted.
type setFailure struct {
	name  string
	value flag.Value
	s     string
	err   error
}

// guardedValue records the value its flag refuses.
type guardedValue struct {
	flag.Value
	name   string
	failed **setFailure
}

func (g guardedValue) Set(s string) error {
	err := g.Value.Set(s)
	if err != nil && *g.failed == nil {
		*g.failed = &setFailure{name: g.name, value: g.Value, s: s, err: err}
	}
	return err
}

// guardedBool is a guardedValue of a boolean flag, which takes no argument.
type guardedBool struct{ guardedValue }

func (g guardedBool) IsBoolFlag() bool { return true }

func (fs *flagSet) printUsage(w io.Writer) {
	fmt.Fprintf(w, "Usage: %s\n\n%s\n\nFlags (each falls back to the environment variable shown):\n", fs.synopsis, fs.about)
	fs.VisitAll(func(f *flag.Flag) {
		arg, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if arg != "" {
			line += " " + arg
		}
		fmt.Fprintf(w, "%s  (%s)\n    \t%s", line, fs.envName(f.Name), usage)
		if f.DefValue != "" && f.DefValue != "false" {
			fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(w)
	})
}

// durationValue is a Go duration flag that refuses negative values, and
// zero unless zeroOK.
type durationValue struct {
	p      *time.Duration
	zeroOK bool
}

func (v durationValue) String() string {
	if v.p == nil {
		return ""
	}
	return v.p.String()
}

func (v durationValue) Set(s string) error {
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		return errors.New("want a Go duration such as 30s or 24h")
	case d < 0, d == 0 && !v.zeroOK:
		return errors.New("want a positive duration")
	}
	*v.p = d
	return nil
}

// sizeValue is a positive size in bytes.
type sizeValue struct{ p *int64 }

func (v sizeValue) String() string {
	if v.p == nil {
		return ""
	}
	return strconv.FormatInt(*v.p, 10)
}

func (v sizeValue) Set(s string) error {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return errors.New("want a positive number of bytes")
	}
	*v.p = n
	return nil
}

// oneOfValue is a string out of a fixed set.
type oneOfValue struct {
	p       *string
	choices []string
}

func (v oneOfValue) String() string {
	if v.p == nil {
		return ""
	}
	return *v.p
}

func (v oneOfValue) Set(s string) error {
	if !slices.Contains(v.choices, s) {
		return fmt.Errorf("want one of %s", strings.Join(v.choices, ", "))
	}
	*v.p = s
	return nil
}

// methodsValue is a comma-separated list of HTTP methods, upper-cased and
// without duplicates.
type methodsValue struct{ p *[]string }

func (v methodsValue) String() string {
	if v.p == nil {
		return ""
	}
	return strings.Join(*v.p, ",")
}

func (v methodsValue) Set(s string) error {
	var methods []string
	for m := range strings.SplitSeq(s, ",") {
		m = strings.ToUpper(strings.TrimSpace(m))
		if !isToken(m) {
			return fmt.Errorf("%q is not an HTTP method", m)
		}
		if !slices.Contains(methods, m) {
			methods = append(methods, m)
		}
	}
	*v.p = methods
	return nil
}

// headerNameValue is an HTTP header name, canonicalised.
type headerNameValue struct{ p *string }

func (v headerNameValue) String() string {
	if v.p == nil {
		return ""
	}
	return *v.p
}

func (v headerNameValue) Set(s string) error {
	if !isToken(s) {
		return fmt.Errorf("%q is not a header name", s)
	}
	*v.p = http.CanonicalHeaderKey(s)
	return nil
}

// isToken reports whether s is an RFC 9110 token (methods, header names).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// httpURLValue is an absolute http or https URL.
type httpURLValue struct{ p **url.URL }

func (v httpURLValue) String() string {
	if v.p == nil || *v.p == nil {
		return ""
	}
	return (*v.p).Redacted()
}

func (v httpURLValue) Set(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return errors.New("not a URL")
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("want an absolute http:// or https:// URL")
	}
	if u.Fragment != "" {
		return errors.New("a fragment is not allowed")
	}
	if u.User != nil {
		// The proxy would not send them: the upstream gets the client's own
		// Authorization header.
		return errors.New("credentials in the URL are not supported")
	}
	*v.p = u
	return nil
}
