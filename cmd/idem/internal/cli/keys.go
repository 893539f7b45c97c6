package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/cmd/idem/internal/keyadmin"
	"github.com/idem-dev/idem/cmd/idem/internal/storeurl"
	"github.com/idem-dev/idem/idemcrypt"
	"github.com/idem-dev/idem/idemstore"
)

// storeOpener opens the store a URL names (storeurl.Open). Tests pass one
// that shares a memory store between commands or interleaves writes.
type storeOpener func(ctx context.Context, rawURL string) (idemstore.Store, func() error, error)

// keysCommand is one subcommand of `idem keys`.
type keysCommand struct {
	name    string
	summary string
	run     func(ctx context.Context, e *env, args []string, open storeOpener) error
}

var keysCommands = []keysCommand{
	{"list", "list records, filtered by state, tenant, endpoint and age", runKeysList},
	{"show", "print one record: its state, times and stored response", runKeysShow},
	{"resolve", "settle an unknown record to completed or released", runKeysResolve},
	{"purge", "delete expired records, or one record (--force for unknown, in_progress, completed)", runKeysPurge},
	{"rotate-encryption", "re-encrypt stored responses under the newest key", runKeysRotate},
}

const keysSynopsis = "idem keys list|show|resolve|purge|rotate-encryption [flags]"

func printKeysUsage(w io.Writer) {
	fmt.Fprintf(w, "Usage: %s\n\nInspects and settles the records of a store, on the operator's own terminal\n"+
		"(keys are shown; logs only ever name a record by its key_hash).\n\nSubcommands:\n", keysSynopsis)
	for _, c := range keysCommands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, "\nRun 'idem keys SUBCOMMAND --help' for its flags.\n")
}

func runKeys(ctx context.Context, e *env, args []string) error {
	return keysMain(ctx, e, args, openExisting)
}

// openExisting opens a store without creating or migrating anything (see
// openInspect): `idem keys` on a mistyped path or the wrong schema fails
// rather than report an empty new database.
func openExisting(ctx context.Context, rawURL string) (idemstore.Store, func() error, error) {
	return openInspect(ctx, rawURL)
}

// keysMain dispatches `idem keys` to its subcommand.
func keysMain(ctx context.Context, e *env, args []string, open storeOpener) error {
	if len(args) == 0 {
		return usageErrorf("want a subcommand: list, show, resolve, purge or rotate-encryption")
	}
	switch args[0] {
	case "-h", "-help", "--help":
		printKeysUsage(e.stdout)
		return flag.ErrHelp
	}
	for _, c := range keysCommands {
		if c.name == args[0] {
			return c.run(ctx, e, args[1:], open)
		}
	}
	return usageErrorf("unknown subcommand %q: want list, show, resolve, purge or rotate-encryption", args[0])
}

// scopeFlags are the flags that name a tenant: the scope as stored, or the
// scope header's value, hashed as the proxy does.
type scopeFlags struct {
	scope, headerValue string
}

func (s *scopeFlags) register(fs *flagSet) {
	fs.StringVar(&s.scope, "tenant", "", "`SCOPE` as stored: for 'idem proxy --scope-header', the hex SHA-256 of the header's value")
	fs.StringVar(&s.headerValue, "tenant-header-value", "", "the scope header's `VALUE`, hashed as the proxy does (instead of --tenant)")
}

// resolve returns the scope named, or "" (every scope for a filter, the
// empty scope for a record).
func (s *scopeFlags) resolve() (string, error) {
	switch {
	case s.scope != "" && s.headerValue != "":
		return "", usageErrorf("give --tenant or --tenant-header-value, not both")
	case s.headerValue != "":
		return scopeOf(s.headerValue), nil
	}
	return s.scope, nil
}

// stateValue is a record state.
type stateValue struct{ p *idemstore.State }

func (v stateValue) String() string {
	if v.p == nil {
		return ""
	}
	return string(*v.p)
}

func (v stateValue) Set(s string) error {
	st := idemstore.State(s)
	if !st.Valid() {
		return errors.New("want in_progress, completed, released or unknown")
	}
	*v.p = st
	return nil
}

// countValue is a non-negative integer.
type countValue struct{ p *int }

func (v countValue) String() string {
	if v.p == nil {
		return ""
	}
	return strconv.Itoa(*v.p)
}

func (v countValue) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return errors.New("want a number, 0 or more")
	}
	*v.p = n
	return nil
}

// openStore opens the store and returns it with a function that closes it
// and joins its error into *err.
func openStore(ctx context.Context, open storeOpener, rawURL string) (idemstore.Store, func(err *error), error) {
	s, closeStore, err := open(ctx, rawURL)
	if err != nil {
		return nil, nil, fmt.Errorf("opening the store: %w", err)
	}
	return s, func(err *error) {
		if cerr := closeStore(); cerr != nil {
			*err = errors.Join(*err, fmt.Errorf("closing the store: %w", cerr))
		}
	}, nil
}

// keysListOptions are the settings of `idem keys list`.
type keysListOptions struct {
	store     string
	state     idemstore.State
	scope     string
	endpoint  string
	key       string
	prefix    string
	olderThan time.Duration
	limit     int
	json      bool
}

func parseKeysList(args []string, e *env) (*keysListOptions, error) {
	o := &keysListOptions{store: storeurl.Default, limit: 100}
	var sf scopeFlags
	fs := newFlagSet("keys list", "idem keys list [flags]",
		"Lists records newest first as a table (tenant, endpoint, key, state,\n"+
			"attempts, age, time to expiry) or, with --json, one JSON object a line.\n"+
			"To sort them it reads every record that matches the filters: on a large\n"+
			"store, narrow them (--key, --prefix, --tenant, --endpoint, --state).")
	fs.Var(storeValue{&o.store}, "store", "store `URL`: sqlite:PATH, memory:, postgres://…, mysql://… or redis://…")
	fs.Var(stateValue{&o.state}, "state", "only records in `STATE`: in_progress, completed, released or unknown")
	sf.register(fs)
	fs.StringVar(&o.endpoint, "endpoint", "", "only records of `ENDPOINT`, e.g. \"POST /v1/payments\"")
	fs.StringVar(&o.key, "key", "", "only records whose Idempotency-Key is `KEY` (in any tenant and endpoint)")
	fs.StringVar(&o.prefix, "prefix", "", "only records whose Idempotency-Key starts with `PREFIX`")
	fs.Var(durationValue{p: &o.olderThan}, "older-than", "only records created more than `DURATION` ago")
	fs.Var(countValue{&o.limit}, "limit", "print at most `N` records; 0 prints all")
	fs.BoolVar(&o.json, "json", false, "print JSON lines instead of a table")
	if err := fs.parse(args, e); err != nil {
		return nil, err
	}
	if o.key != "" && o.prefix != "" {
		return nil, usageErrorf("give --key or --prefix, not both")
	}
	var err error
	o.scope, err = sf.resolve()
	return o, err
}

// matches reports whether rec passes the key filters, which the store does
// not apply.
func (o *keysListOptions) matches(rec *idemstore.Record) bool {
	switch {
	case o.key != "":
		return rec.Key == o.key
	case o.prefix != "":
		return strings.HasPrefix(rec.Key, o.prefix)
	}
	return true
}

// newestFirst orders records by creation, newest first; records created at
// the same instant keep the store's (tenant, endpoint, key) order.
func newestFirst(a, b *idemstore.Record) int { return b.CreatedAt.Compare(a.CreatedAt) }

// listPage is the page size of `idem keys list`.
const listPage = 500

func runKeysList(ctx context.Context, e *env, args []string, open storeOpener) (err error) {
	o, err := parseKeysList(args, e)
	if err != nil {
		return err
	}
	store, closeStore, err := openStore(ctx, open, o.store)
	if err != nil {
		return err
	}
	defer closeStore(&err)

	now := time.Now()
	p := &idemstore.ListParams{State: o.state, Scope: o.scope, Endpoint: o.endpoint}
	if o.olderThan > 0 {
		p.CreatedBefore = now.Add(-o.olderThan)
	}
	// The store lists records by identity: every matching one is read, and
	// the newest --limit of them kept (memory bounded by the limit).
	var recs []*idemstore.Record
	matched := 0
	for {
		p.Limit = listPage
		page, err := store.KeyList(ctx, p)
		if err != nil {
			return fmt.Errorf("listing records: %w", err)
		}
		for _, rec := range page {
			if o.matches(rec) {
				recs = append(recs, rec)
				matched++
			}
		}
		if o.limit > 0 && len(recs) >= 2*o.limit+listPage {
			slices.SortStableFunc(recs, newestFirst)
			recs = slices.Clip(recs[:o.limit])
		}
		if len(page) < p.Limit {
			break
		}
		p.After = &page[len(page)-1].Identity
	}
	slices.SortStableFunc(recs, newestFirst)
	if o.limit > 0 && len(recs) > o.limit {
		recs = recs[:o.limit]
	}

	if o.json {
		enc := json.NewEncoder(e.stdout)
		for _, r := range recs {
			if err := enc.Encode(recordJSON(r, false)); err != nil {
				return err
			}
		}
	} else {
		printRecords(e.stdout, recs, now)
	}
	if more := matched - len(recs); more > 0 {
		fmt.Fprintf(e.stderr, "%d more records match: raise --limit (now %d) or narrow the filters.\n", more, o.limit)
	}
	if span := spanNote(ctx, store); span != "" {
		fmt.Fprintf(e.stderr, "Listed the records of %s.\n", span)
	}
	return nil
}

// printRecords prints the table of `idem keys list`.
func printRecords(w io.Writer, recs []*idemstore.Record, now time.Time) {
	if len(recs) == 0 {
		fmt.Fprintln(w, "No records.")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tENDPOINT\tKEY\tSTATE\tATTEMPTS\tAGE\tEXPIRES")
	for _, r := range recs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", orDash(printable(r.Scope)), orDash(printable(r.Endpoint)),
			printable(r.Key), r.State, r.Attempts, roughDuration(now.Sub(r.CreatedAt)), "in "+roughDuration(r.ExpiresAt.Sub(now)))
	}
	tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// printable returns s as is when it is printable text without spaces or
// tabs (every key the middleware accepts is), and Go-quoted otherwise, so
// that a stored value cannot drive the operator's terminal.
func printable(s string) string {
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsGraphic(r) || (unicode.IsSpace(r) && r != ' ') {
			return strconv.Quote(s)
		}
	}
	return s
}

// roughDuration prints d to the second, and to the minute past a day.
func roughDuration(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	if d >= 24*time.Hour {
		days := d / (24 * time.Hour)
		rest := (d % (24 * time.Hour)).Truncate(time.Minute)
		return fmt.Sprintf("%dd%s", days, strings.TrimSuffix(rest.String(), "0s"))
	}
	return d.Truncate(time.Second).String()
}

// jsonRecord is a record as `idem keys list --json` and `show --json` print
// it. The fencing token is not shown.
type jsonRecord struct {
	Scope             string          `json:"scope"`
	Endpoint          string          `json:"endpoint"`
	Key               string          `json:"key"`
	KeyHash           string          `json:"key_hash"`
	State             idemstore.State `json:"state"`
	Attempts          int             `json:"attempts"`
	Fingerprint       string          `json:"fingerprint"`
	CreatedAt         time.Time       `json:"created_at"`
	UpdatedAt         time.Time       `json:"updated_at"`
	ExpiresAt         time.Time       `json:"expires_at"`
	StartedAt         time.Time       `json:"started_at"`
	LockedUntil       *time.Time      `json:"locked_until,omitempty"`
	LeaseExpiredState idemstore.State `json:"lease_expired_state"`
	RecoveryPoint     string          `json:"recovery_point,omitempty"`
	NotReplayable     bool            `json:"not_replayable,omitempty"`
	ResponseStatus    int             `json:"response_status,omitempty"`
	Response          *jsonResponse   `json:"response,omitempty"`
	// The reconciliation state (idemstore.Record.ReconcileAfter...).
	ReconcileAfter    *time.Time `json:"reconcile_after,omitempty"`
	ReconcileAttempts int        `json:"reconcile_attempts,omitempty"`
	ReconcileError    string     `json:"reconcile_error,omitempty"`
}

type jsonResponse struct {
	Status     int         `json:"status"`
	Header     http.Header `json:"header"`
	BodyBase64 []byte      `json:"body_base64"`
}

func recordJSON(r *idemstore.Record, full bool) jsonRecord {
	j := jsonRecord{
		Scope: r.Scope, Endpoint: r.Endpoint, Key: r.Key, KeyHash: r.LogHash(),
		State: r.State, Attempts: r.Attempts, Fingerprint: r.Fingerprint,
		CreatedAt: r.CreatedAt.UTC(), UpdatedAt: r.UpdatedAt.UTC(), ExpiresAt: r.ExpiresAt.UTC(), StartedAt: r.StartedAt.UTC(),
		LeaseExpiredState: r.LeaseExpiredState, RecoveryPoint: r.RecoveryPoint, NotReplayable: r.NotReplayable,
	}
	if r.State == idemstore.StateInProgress {
		lu := r.LockedUntil.UTC()
		j.LockedUntil = &lu
	}
	if !r.ReconcileAfter.IsZero() {
		ra := r.ReconcileAfter.UTC()
		j.ReconcileAfter = &ra
	}
	j.ReconcileAttempts, j.ReconcileError = r.ReconcileAttempts, r.ReconcileError
	if r.Response != nil {
		j.ResponseStatus = r.Response.Status
		if full {
			j.Response = &jsonResponse{Status: r.Response.Status, Header: r.Response.Header, BodyBase64: r.Response.Body}
		}
	}
	return j
}

// identityFlags name one record: tenant, endpoint and the key.
type identityFlags struct {
	store    string
	scope    scopeFlags
	endpoint string
}

func (f *identityFlags) register(fs *flagSet) {
	fs.Var(storeValue{&f.store}, "store", "store `URL`: sqlite:PATH, memory:, postgres://…, mysql://… or redis://…")
	f.scope.register(fs)
	fs.StringVar(&f.endpoint, "endpoint", "", "`ENDPOINT` of the record, e.g. \"POST /v1/payments\"")
}

// identity returns the record's identity from the flags and the key.
func (f *identityFlags) identity(key string) (idemstore.Identity, error) {
	scope, err := f.scope.resolve()
	if err != nil {
		return idemstore.Identity{}, err
	}
	if f.endpoint == "" {
		return idemstore.Identity{}, usageErrorf("--endpoint (or %s) is required", envName("endpoint"))
	}
	if key == "" {
		return idemstore.Identity{}, usageErrorf("the key is empty")
	}
	return idemstore.Identity{Scope: scope, Endpoint: f.endpoint, Key: key}, nil
}

// oneKey returns the single positional argument, the key.
func oneKey(pos []string) (string, error) {
	switch len(pos) {
	case 0:
		return "", usageErrorf("want the KEY")
	case 1:
		return pos[0], nil
	}
	return "", usageErrorf("unexpected argument %q (want one KEY; use -- before a key that starts with -)", pos[1])
}

// keysShowOptions are the settings of `idem keys show`.
type keysShowOptions struct {
	identityFlags
	keyring keyringFlag
	key     string
	json    bool
}

func parseKeysShow(args []string, e *env) (*keysShowOptions, idemstore.Identity, error) {
	o := &keysShowOptions{identityFlags: identityFlags{store: storeurl.Default}}
	fs := newFlagSet("keys show", "idem keys show --endpoint ENDPOINT [--tenant SCOPE] [flags] KEY",
		"Prints one record: its state, attempts, times, fingerprint and the stored\n"+
			"response (status, headers and the beginning of the body).")
	o.register(fs)
	o.keyring.register(fs)
	fs.BoolVar(&o.json, "json", false, "print the record as JSON, the body in base64")
	pos, err := fs.parseArgs(args, e)
	if err != nil {
		return nil, idemstore.Identity{}, err
	}
	if o.key, err = oneKey(pos); err != nil {
		return nil, idemstore.Identity{}, err
	}
	id, err := o.identity(o.key)
	return o, id, err
}

// getRecord reads a record and names a missing one in the error.
func getRecord(ctx context.Context, store idemstore.Store, id idemstore.Identity) (*idemstore.Record, error) {
	rec, err := store.KeyGet(ctx, id)
	if errors.Is(err, idemstore.ErrNotFound) {
		return nil, fmt.Errorf("no record with key %s on %q in tenant %q (or it is past its retention)", printable(id.Key), id.Endpoint, id.Scope)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the record: %w", err)
	}
	return rec, nil
}

func runKeysShow(ctx context.Context, e *env, args []string, open storeOpener) (err error) {
	o, id, err := parseKeysShow(args, e)
	if err != nil {
		return err
	}
	kr, err := o.keyring.load(e)
	if err != nil {
		return err
	}
	store, closeStore, err := openStore(ctx, open, o.store)
	if err != nil {
		return err
	}
	defer closeStore(&err)
	store = idemcrypt.New(store, kr)
	rec, err := getRecord(ctx, store, id)
	if err != nil {
		return err
	}
	if o.json {
		return json.NewEncoder(e.stdout).Encode(recordJSON(rec, true))
	}
	printRecord(e.stdout, rec, time.Now())
	return nil
}

// bodyPreview is how much of a stored body `idem keys show` prints.
const bodyPreview = 1024

// printRecord prints the record for `idem keys show`.
func printRecord(w io.Writer, r *idemstore.Record, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	at := func(t time.Time) string {
		rel := roughDuration(now.Sub(t)) + " ago"
		if t.After(now) {
			rel = "in " + roughDuration(t.Sub(now))
		}
		return t.UTC().Format(time.RFC3339Nano) + " (" + rel + ")"
	}
	fmt.Fprintf(tw, "key:\t%s\n", printable(r.Key))
	fmt.Fprintf(tw, "tenant:\t%s\n", orDash(printable(r.Scope)))
	fmt.Fprintf(tw, "endpoint:\t%s\n", printable(r.Endpoint))
	fmt.Fprintf(tw, "key hash:\t%s\n", r.LogHash())
	fmt.Fprintf(tw, "state:\t%s\n", r.State)
	fmt.Fprintf(tw, "attempts:\t%d\n", r.Attempts)
	fmt.Fprintf(tw, "fingerprint:\t%s\n", r.Fingerprint)
	fmt.Fprintf(tw, "created:\t%s\n", at(r.CreatedAt))
	fmt.Fprintf(tw, "updated:\t%s\n", at(r.UpdatedAt))
	fmt.Fprintf(tw, "started:\t%s\n", at(r.StartedAt))
	if r.State == idemstore.StateInProgress {
		fmt.Fprintf(tw, "locked until:\t%s\n", at(r.LockedUntil))
	}
	if r.State == idemstore.StateUnknown {
		fmt.Fprintf(tw, "expires:\tnever while unknown (retention %s restarts when it is settled)\n", roughDuration(r.TTL))
	} else {
		fmt.Fprintf(tw, "expires:\t%s\n", at(r.ExpiresAt))
	}
	fmt.Fprintf(tw, "lease expires to:\t%s\n", r.LeaseExpiredState)
	if r.State == idemstore.StateUnknown {
		switch {
		case r.ReconcileAfter.IsZero() || !r.ReconcileAfter.After(now):
			fmt.Fprintf(tw, "next reconcile:\tdue now\n")
		default:
			fmt.Fprintf(tw, "next reconcile:\t%s\n", at(r.ReconcileAfter))
		}
	}
	if r.State == idemstore.StateUnknown || r.ReconcileAttempts > 0 {
		fmt.Fprintf(tw, "reconcile attempts:\t%d\n", r.ReconcileAttempts)
	}
	if r.ReconcileError != "" {
		fmt.Fprintf(tw, "reconcile error:\t%s\n", printable(r.ReconcileError))
	}
	if r.RecoveryPoint != "" {
		fmt.Fprintf(tw, "recovery point:\t%s\n", printable(r.RecoveryPoint))
	}
	switch {
	case r.NotReplayable:
		fmt.Fprintf(tw, "response:\tnot replayable (streamed or too large; a retry gets 409 not-replayable)\n")
	case r.Response == nil:
		fmt.Fprintf(tw, "response:\tnone\n")
	default:
		fmt.Fprintf(tw, "response:\t%d %s\n", r.Response.Status, http.StatusText(r.Response.Status))
	}
	tw.Flush()
	if r.Response == nil {
		return
	}
	names := make([]string, 0, len(r.Response.Header))
	for name := range r.Response.Header {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		for _, v := range r.Response.Header[name] {
			fmt.Fprintf(w, "  %s: %s\n", printable(name), printable(v))
		}
	}
	body := r.Response.Body
	fmt.Fprintf(w, "body: %d bytes\n", len(body))
	if len(body) == 0 {
		return
	}
	preview := body[:min(len(body), bodyPreview)]
	if textual(preview) {
		for line := range strings.Lines(string(preview)) {
			fmt.Fprintf(w, "  %s\n", strings.TrimRight(line, "\r\n"))
		}
	} else {
		fmt.Fprintf(w, "  %s\n", strconv.Quote(string(preview)))
	}
	if len(body) > len(preview) {
		fmt.Fprintf(w, "  … %d more bytes (show --json prints all of it)\n", len(body)-len(preview))
	}
}

// textual reports whether b is text safe to print as is: UTF-8 (but for a
// rune cut at the end of a preview) without control characters other than
// line breaks and tabs.
func textual(b []byte) bool {
	for i := 0; i < utf8.UTFMax-1 && !utf8.Valid(b); i++ {
		b = b[:len(b)-1]
	}
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if unicode.IsControl(r) && r != '\n' && r != '\t' && r != '\r' {
			return false
		}
	}
	return true
}

// headersValue collects repeated "Name: value" flags.
type headersValue struct{ p *http.Header }

func (v headersValue) String() string { return "" }

func (v headersValue) Set(s string) error {
	name, value, ok := strings.Cut(s, ":")
	name, value = strings.TrimSpace(name), strings.TrimSpace(value)
	if !ok || !isToken(name) {
		return errors.New(`want "Name: value"`)
	}
	if strings.ContainsAny(value, "\r\n\x00") {
		return errors.New("the value has a line break or NUL")
	}
	name = http.CanonicalHeaderKey(name)
	if replayed := idem.DefaultStoredHeaders(); !slices.Contains(replayed, name) {
		return fmt.Errorf("%s is not replayed; want one of %s", name, strings.Join(replayed, ", "))
	}
	if *v.p == nil {
		*v.p = make(http.Header)
	}
	v.p.Add(name, value)
	return nil
}

// keysResolveOptions are the settings of `idem keys resolve`.
type keysResolveOptions struct {
	identityFlags
	keyring       keyringFlag
	key           string
	to            string
	status        int
	body          string
	header        http.Header
	notReplayable bool
}

func parseKeysResolve(args []string, e *env) (*keysResolveOptions, idemstore.Identity, error) {
	o := &keysResolveOptions{identityFlags: identityFlags{store: storeurl.Default}}
	fs := newFlagSet("keys resolve",
		"idem keys resolve --endpoint ENDPOINT [--tenant SCOPE] --to completed|released [--status N --body TEXT|@FILE --header 'Name: value'] KEY",
		"Settles an unknown record, once you know whether its operation happened:\n"+
			"  --to completed   it did: retries get the response given here (--status,\n"+
			"                   --body, --header), or 409 not-replayable with --not-replayable\n"+
			"  --to released    it did not: the next retry executes it\n"+
			"The write is fenced on the record's token as read just before, so a record\n"+
			"that changed meanwhile is left alone (exit 1). An audit line goes to stderr.")
	o.register(fs)
	o.keyring.register(fs)
	fs.Var(oneOfValue{&o.to, []string{string(idemstore.StateCompleted), string(idemstore.StateReleased)}},
		"to", "`STATE` to settle the record to: completed or released (required)")
	fs.IntVar(&o.status, "status", 0, "HTTP `STATUS` retries get, with --to completed")
	fs.StringVar(&o.body, "body", "", "response body `TEXT`, or @FILE to read it from a file, with --to completed")
	fs.Var(headersValue{&o.header}, "header", "response header `'Name: value'`, repeatable, with --to completed; one of "+strings.Join(idem.DefaultStoredHeaders(), ", "))
	fs.BoolVar(&o.notReplayable, "not-replayable", false, "with --to completed and no response: retries get 409 not-replayable")
	pos, err := fs.parseArgs(args, e)
	if err != nil {
		return nil, idemstore.Identity{}, err
	}
	if o.key, err = oneKey(pos); err != nil {
		return nil, idemstore.Identity{}, err
	}
	id, err := o.identity(o.key)
	if err != nil {
		return nil, idemstore.Identity{}, err
	}
	hasResponse := o.status != 0 || o.body != "" || len(o.header) > 0
	switch {
	case o.to == "":
		return nil, id, usageErrorf("--to completed or --to released is required")
	case o.to == string(idemstore.StateReleased) && (hasResponse || o.notReplayable):
		return nil, id, usageErrorf("--status, --body, --header and --not-replayable go with --to completed")
	case o.to == string(idemstore.StateReleased):
	case o.notReplayable && hasResponse:
		return nil, id, usageErrorf("--not-replayable stores no response: drop --status, --body and --header")
	case !o.notReplayable && (o.status < 100 || o.status > 599):
		return nil, id, usageErrorf("--to completed needs --status between 100 and 599 (or --not-replayable)")
	}
	return o, id, nil
}

// response returns the response to store, reading @FILE bodies.
func (o *keysResolveOptions) response() (*idemstore.Response, error) {
	if o.to != string(idemstore.StateCompleted) || o.notReplayable {
		return nil, nil
	}
	body := []byte(o.body)
	if name, ok := strings.CutPrefix(o.body, "@"); ok {
		b, err := os.ReadFile(name)
		if err != nil {
			return nil, fmt.Errorf("reading the body: %w", err)
		}
		body = b
	}
	header := o.header
	if header == nil {
		header = make(http.Header)
	}
	return &idemstore.Response{Status: o.status, Header: header, Body: body}, nil
}

// operator names the person running the command in audit lines.
func operator(e *env) string {
	if u, ok := e.lookupEnv("USER"); ok && u != "" {
		return u
	}
	return "unknown"
}

func runKeysResolve(ctx context.Context, e *env, args []string, open storeOpener) (err error) {
	o, id, err := parseKeysResolve(args, e)
	if err != nil {
		return err
	}
	resp, err := o.response()
	if err != nil {
		return err
	}
	kr, err := o.keyring.load(e)
	if err != nil {
		return err
	}
	store, closeStore, err := openStore(ctx, open, o.store)
	if err != nil {
		return err
	}
	defer closeStore(&err)
	store = idemcrypt.New(store, kr)
	rec, err := getRecord(ctx, store, id)
	if err != nil {
		return err
	}
	if rec.State != idemstore.StateUnknown {
		return fmt.Errorf("the record is %s, not unknown: only unknown records are resolved", rec.State)
	}
	to := idemstore.State(o.to)
	res := &keyadmin.Resolution{Identity: id, Token: rec.Token, To: to, Response: resp, Operator: operator(e)}
	err = keyadmin.Resolve(ctx, store, res)
	switch {
	case keyadmin.Changed(err), errors.Is(err, idemstore.ErrNotFound):
		return fmt.Errorf("the record changed after it was read (another attempt, resolver or purge got to it); nothing was written: look at it again with 'idem keys show' (%w)", err)
	case err != nil:
		return fmt.Errorf("resolving the record: %w", err)
	}
	e.logger.LogAttrs(ctx, slog.LevelInfo, "idem keys: record resolved", res.Audit()...)
	switch {
	case to == idemstore.StateReleased:
		fmt.Fprintf(e.stdout, "Resolved %s to released: the next retry executes it.\n", printable(id.Key))
	case resp == nil:
		fmt.Fprintf(e.stdout, "Resolved %s to completed, not replayable: retries get 409 not-replayable.\n", printable(id.Key))
	default:
		fmt.Fprintf(e.stdout, "Resolved %s to completed: retries get %d with the %d-byte body.\n", printable(id.Key), resp.Status, len(resp.Body))
	}
	return nil
}

// keysPurgeOptions are the settings of `idem keys purge`.
type keysPurgeOptions struct {
	identityFlags
	key       string
	batchSize int
	force     bool
}

func parseKeysPurge(args []string, e *env) (*keysPurgeOptions, *idemstore.Identity, error) {
	o := &keysPurgeOptions{identityFlags: identityFlags{store: storeurl.Default}, batchSize: 1000}
	fs := newFlagSet("keys purge", "idem keys purge [--store URL] [--batch-size N] | --key KEY --endpoint ENDPOINT [--tenant SCOPE] [--force]",
		"Without --key, deletes every record past its retention, in batches, as the\n"+
			"reaper of 'idem maintain' does (never an unknown record: it does not expire).\n"+
			"With --key, deletes one record, so that its key can be used again with\n"+
			"another request. A released record is deleted as asked. Any other state\n"+
			"needs --force, because the next request with the key then executes again:\n"+
			"an unknown record's operation may have happened (settle it with 'idem keys\n"+
			"resolve' instead when you can), an in_progress one belongs to a running\n"+
			"attempt, a completed one's operation did happen. The deletion is fenced on\n"+
			"the record as read just before. An audit line goes to stderr.")
	o.register(fs)
	fs.StringVar(&o.key, "key", "", "the `KEY` of the one record to delete")
	fs.BoolVar(&o.force, "force", false, "with --key: delete an unknown, in_progress or completed record too")
	fs.Var(countValue{&o.batchSize}, "batch-size", "records deleted per store call, at most `N`, without --key")
	if err := fs.parse(args, e); err != nil {
		return nil, nil, err
	}
	if o.key == "" {
		if o.endpoint != "" || o.scope.scope != "" || o.scope.headerValue != "" {
			return nil, nil, usageErrorf("--endpoint and --tenant name one record: give its --key too")
		}
		if o.batchSize == 0 {
			return nil, nil, usageErrorf("--batch-size must be positive")
		}
		if o.force {
			return nil, nil, usageErrorf("--force goes with --key: expired records need none")
		}
		return o, nil, nil
	}
	id, err := o.identity(o.key)
	if err != nil {
		return nil, nil, err
	}
	return o, &id, nil
}

func runKeysPurge(ctx context.Context, e *env, args []string, open storeOpener) (err error) {
	o, id, err := parseKeysPurge(args, e)
	if err != nil {
		return err
	}
	store, closeStore, err := openStore(ctx, open, o.store)
	if err != nil {
		return err
	}
	defer closeStore(&err)
	if id == nil {
		return purgeExpired(ctx, e, store, o.batchSize)
	}
	return purgeOne(ctx, e, store, *id, o.force)
}

// purgeExpired reaps until no expired record is left.
func purgeExpired(ctx context.Context, e *env, store idemstore.Store, batch int) error {
	total := 0
	for {
		n, err := store.KeyReap(ctx, &idemstore.ReapParams{Limit: batch})
		total += n
		if err != nil {
			return fmt.Errorf("deleting expired records (%d deleted so far): %w", total, err)
		}
		if n == 0 {
			break
		}
	}
	e.logger.Info("idem keys: expired records purged", "action", "purge_expired", "count", total, "operator", operator(e))
	fmt.Fprintf(e.stdout, "Purged %d expired records.\n", total)
	if span := spanNote(ctx, store); span != "" {
		fmt.Fprintf(e.stdout, "Purged on %s.\n", span)
	}
	return nil
}

// purgeOne deletes one record with the store's administrative delete
// (KeyPurge), fenced on the token read just before. A released record needs
// nothing more; any other state needs force, and its refusal says why.
func purgeOne(ctx context.Context, e *env, store idemstore.Store, id idemstore.Identity, force bool) error {
	rec, err := getRecord(ctx, store, id)
	if err != nil {
		return err
	}
	name := describeRecord(id)
	if !force {
		switch rec.State {
		case idemstore.StateInProgress:
			return fmt.Errorf("%s is in_progress: an attempt holds its lease until %s; wait for it to finish, or delete it with --force (the next request with the key then executes again, maybe while the first one runs)",
				name, rec.LockedUntil.UTC().Format(time.RFC3339))
		case idemstore.StateUnknown:
			return fmt.Errorf("%s is unknown: its operation may have happened; settle it first with 'idem keys resolve --to completed|released', or delete it with --force (the next request with the key then executes again)", name)
		case idemstore.StateCompleted:
			return fmt.Errorf("%s is completed: it is kept until its retention ends at %s, when the reaper deletes it; delete it now with --force (the next request with the key then executes again)",
				name, rec.ExpiresAt.UTC().Format(time.RFC3339))
		}
	}
	purged, err := store.KeyPurge(ctx, &idemstore.PurgeParams{Identity: id, Token: rec.Token, Force: force})
	switch {
	case errors.Is(err, idemstore.ErrLeaseLost), errors.Is(err, idemstore.ErrNotFound), errors.Is(err, idemstore.ErrInvalidState):
		return fmt.Errorf("%s changed after it was read (another attempt, resolver or purge got to it); nothing was deleted: look at it again with 'idem keys show' (%w)", name, err)
	case err != nil:
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	level := slog.LevelInfo
	if purged.State != idemstore.StateReleased {
		level = slog.LevelWarn
	}
	e.logger.Log(ctx, level, "idem keys: record purged", "action", "purge", "key_hash", id.LogHash(), "endpoint", id.Endpoint, "scope", id.Scope,
		"from", string(purged.State), "to", "deleted", "force", force, "operator", operator(e))
	if purged.State == idemstore.StateReleased {
		fmt.Fprintf(e.stdout, "Purged %s: the key may be used again.\n", printable(id.Key))
	} else {
		fmt.Fprintf(e.stdout, "Purged %s, which was %s: the next request with the key executes again.\n", printable(id.Key), purged.State)
	}
	return nil
}

// describeRecord names a record for an operator: its key, endpoint and
// tenant.
func describeRecord(id idemstore.Identity) string {
	if id.Scope == "" {
		return fmt.Sprintf("the record with key %s on %q", printable(id.Key), id.Endpoint)
	}
	return fmt.Sprintf("the record with key %s on %q in tenant %q", printable(id.Key), id.Endpoint, id.Scope)
}
