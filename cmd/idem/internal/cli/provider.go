package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/idem-dev/idem/cmd/idem/internal/provider"
	"github.com/idem-dev/idem/cmd/idem/internal/storeurl"
)

// providerOptions are the settings of `idem provider`.
type providerOptions struct {
	listen string
	store  string
	faults provider.Faults
}

// parseProvider reads the flags of `idem provider` and their IDEM_*
// fallbacks.
func parseProvider(args []string, e *env) (*providerOptions, error) {
	o := &providerOptions{listen: "127.0.0.1:8081", store: provider.DefaultStore}
	fs := newFlagSet("provider", "idem provider [--listen ADDR] [--store URL] [--fail-rate R] [--timeout-rate R] [--latency D]",
		"Runs the simulated payment provider alone, with a durable ledger:\n"+
			"POST /charges (Idempotency-Key required, deduplicated by idem's own middleware),\n"+
			"GET /charges?idempotency_key=KEY for reconciliation and GET /charges for the\n"+
			"whole ledger. `idem payments --provider-url URL` uses it instead of its own.")
	fs.StringVar(&o.listen, "listen", o.listen, "`ADDR` to serve on; port 0 picks a free one")
	fs.Var(sqlStoreValue{&o.store}, "store", "ledger `URL`: sqlite:PATH, postgres://… (?schema=NAME) or mysql://…")
	registerFaults(fs, &o.faults, "")
	if err := fs.parse(args, e); err != nil {
		return nil, err
	}
	return o, nil
}

// registerFaults adds the fault flags, named with prefix ("" or "provider-").
func registerFaults(fs *flagSet, f *provider.Faults, prefix string) {
	fs.Var(rateValue{&f.FailRate}, prefix+"fail-rate", "`RATE` 0–1 of charges refused with 503 before anything is charged")
	fs.Var(rateValue{&f.TimeoutRate}, prefix+"timeout-rate", "`RATE` 0–1 of charges made and then not answered (the client times out)")
	fs.Var(durationValue{p: &f.Latency, zeroOK: true}, prefix+"latency", "`DURATION` added before each charge is processed")
}

// rateValue is a probability from 0 to 1.
type rateValue struct{ p *float64 }

func (v rateValue) String() string {
	if v.p == nil || *v.p == 0 {
		return ""
	}
	return strconv.FormatFloat(*v.p, 'g', -1, 64)
}

func (v rateValue) Set(s string) error {
	r, err := strconv.ParseFloat(s, 64)
	if err != nil || !(r >= 0 && r <= 1) {
		return errors.New("want a number from 0 to 1")
	}
	*v.p = r
	return nil
}

// sqlStoreValue is a store URL naming a SQL store (SQLite, PostgreSQL or
// MySQL): the payments service and the provider need transactions.
type sqlStoreValue struct{ p *string }

func (v sqlStoreValue) String() string {
	if v.p == nil {
		return ""
	}
	return storeurl.Redact(*v.p)
}

func (v sqlStoreValue) Set(s string) error {
	switch storeurl.Kind(s) {
	case storeurl.KindSQLite, storeurl.KindPostgres, storeurl.KindMySQL:
		*v.p = s
		return nil
	}
	return errors.New("want sqlite:PATH, postgres://… or mysql://… (a SQL store)")
}

func runProvider(ctx context.Context, e *env, args []string) (err error) {
	o, err := parseProvider(args, e)
	if err != nil {
		return err
	}
	p, err := provider.New(&provider.Config{Store: o.store, Faults: o.faults, Logger: e.logger})
	if err != nil {
		return err
	}
	defer func() {
		if cerr := p.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("closing the ledger: %w", cerr))
		}
	}()
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	e.logger.Info("provider listening",
		"addr", ln.Addr().String(),
		"store", storeurl.Kind(o.store),
		"store_url", storeurl.Redact(o.store),
		"fail_rate", o.faults.FailRate,
		"timeout_rate", o.faults.TimeoutRate,
		"latency", o.faults.Latency.String(),
	)
	fmt.Fprintf(e.stdout, "idem provider: listening on http://%s (ledger: GET http://%s/charges)\n", ln.Addr(), ln.Addr())
	// A charge held by the timeout fault ends when its client gives up,
	// which the drain waits for (bounded by the drain timeout).
	return serve(ctx, e, ln, p)
}
