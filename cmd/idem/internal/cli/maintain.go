package cli

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/idem-dev/idem/cmd/idem/internal/storeurl"
	"github.com/idem-dev/idem/idemcrypt"
	"github.com/idem-dev/idem/idemmaint"
)

// maintainOptions are the settings of `idem maintain`.
type maintainOptions struct {
	store         string
	sweepInterval time.Duration
	reapInterval  time.Duration
	batchSize     int
	once          bool
	ops           opsOptions
	reconcile     reconcileOptions
	keyring       keyringFlag
}

// maintainAbout says what the maintainer does, for `idem maintain -h`.
const maintainAbout = "Runs the background maintenance of a store until SIGINT or SIGTERM:\n" +
	"  sweeper     turns in_progress records whose lease expired into unknown (or\n" +
	"              released, for transactional records), logging each one\n" +
	"  reaper      deletes records past their retention, in bounded batches\n" +
	"  reconciler  with --reconcile-url, asks your API about every unknown record\n" +
	"              (GET the template with {key}, {method}, {path}, {scope} filled\n" +
	"              in): 2xx settles it completed with that answer for retries to\n" +
	"              replay, 404 or 410 releases it so the next retry runs, anything\n" +
	"              else leaves it unknown and asks again with backoff. Without it,\n" +
	"              unknown records are counted and logged at warn every pass for an\n" +
	"              operator, who settles them with 'idem keys resolve' (list them\n" +
	"              with 'idem keys list --state unknown').\n" +
	"Several maintainers may run against one shared store. --once runs one pass\n" +
	"of each job and prints what it did (for cron). 'idem proxy --maintain' runs\n" +
	"the same maintainer inside the proxy."

func parseMaintain(args []string, e *env) (*maintainOptions, error) {
	o := &maintainOptions{
		store:         storeurl.Default,
		sweepInterval: idemmaint.DefaultSweepInterval,
		reapInterval:  idemmaint.DefaultReapInterval,
		batchSize:     idemmaint.DefaultBatchSize,
	}
	fs := newFlagSet("maintain", "idem maintain [--store URL] [--sweep-interval D] [--reap-interval D] [--batch-size N] [--reconcile-url TEMPLATE] [--once]", maintainAbout)
	fs.Var(storeValue{&o.store}, "store", "store `URL`: sqlite:PATH, memory:, postgres://…, mysql://… or redis://…")
	fs.Var(durationValue{p: &o.sweepInterval}, "sweep-interval", "`DURATION` between two sweeps of expired leases")
	fs.Var(durationValue{p: &o.reapInterval}, "reap-interval", "`DURATION` between two reaps of expired records")
	fs.Var(countValue{&o.batchSize}, "batch-size", "records one store call sweeps, reaps or lists, at most `N`")
	fs.BoolVar(&o.once, "once", false, "run one pass of each job, print what it did and exit")
	o.ops.register(fs)
	o.reconcile.register(fs)
	o.keyring.register(fs)
	if err := fs.parse(args, e); err != nil {
		return nil, err
	}
	if o.batchSize == 0 {
		return nil, usageErrorf("--batch-size must be positive")
	}
	if err := o.reconcile.check(true, ""); err != nil {
		return nil, err
	}
	return o, nil
}

// maintainerConfig is the configuration of the maintainer of `idem
// maintain` and `idem proxy --maintain`: no reconciler, unknown records
// logged for operators.
func maintainerConfig(e *env, sweep, reap time.Duration, batch int) *idemmaint.Config {
	return &idemmaint.Config{
		SweepInterval: sweep,
		ReapInterval:  reap,
		BatchSize:     batch,
		Logger:        e.logger,
		OnReconcile: func(res idemmaint.ReconcileResult, err error) {
			if err != nil || res.Backlog == 0 {
				return
			}
			e.logger.Warn("idem maintain: unknown records await an operator; list them with 'idem keys list --state unknown' and settle them with 'idem keys resolve'",
				slog.Int("count", res.Backlog))
		},
	}
}

func runMaintain(ctx context.Context, e *env, args []string) error {
	return maintainMain(ctx, e, args, storeurl.Open)
}

func maintainMain(ctx context.Context, e *env, args []string, open storeOpener) (err error) {
	o, err := parseMaintain(args, e)
	if err != nil {
		return err
	}
	keyring, err := o.keyring.load(e)
	if err != nil {
		return err
	}
	store, closeStore, err := openStore(ctx, open, o.store)
	if err != nil {
		return err
	}
	defer closeStore(&err)
	// The reconciler stores the answers it finds, and the console shows
	// records: both through the keyring.
	raw := store // names its masters; the keyring's wrapper does not
	store = idemcrypt.New(store, keyring)
	cfg := maintainerConfig(e, o.sweepInterval, o.reapInterval, o.batchSize)
	// The default grace covers proxies with the default lease; the
	// operator of proxies with a longer one sets --reconcile-grace.
	o.reconcile.apply(e, cfg, idemmaint.DefaultLookupMaxBody, defaultGrace(0))
	m := idemmaint.New(store, cfg)
	if o.once {
		err := m.RunOnce(ctx)
		printMaintainStats(e, m.Stats())
		if span := spanNote(ctx, raw); span != "" {
			fmt.Fprintf(e.stdout, "Swept and reaped on %s.\n", span)
		}
		if err != nil {
			return fmt.Errorf("maintaining: %w", err)
		}
		return nil
	}
	e.logger.Info("maintaining",
		"store", storeurl.Kind(o.store),
		"store_url", storeurl.Redact(o.store),
		"sweep_interval", o.sweepInterval,
		"reap_interval", o.reapInterval,
		"batch_size", o.batchSize,
		"reconciler", o.reconcile.kind(),
		"encryption_keys", keyNames(keyring),
	)
	if span := spanNote(ctx, raw); span != "" {
		e.logger.Info("maintaining the records of several masters", "store_span", span)
	}
	o2, err := newOps(&o.ops, opsParts{Store: store, Maintainer: m, Logger: e.logger})
	if err != nil {
		return err
	}
	waitOps, err := startOps(ctx, e, &o.ops, o2)
	if err != nil {
		return err
	}
	defer waitOps()
	if err := m.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	e.logger.Info("shutting down")
	m.Stop()
	s := m.Stats()
	e.logger.Info("stopped", "swept", s.Swept, "reaped", s.Reaped, "unknown_backlog", s.UnknownBacklog, "pass_errors", s.PassErrors)
	return nil
}

// printMaintainStats prints what `idem maintain --once` did.
func printMaintainStats(e *env, s idemmaint.Stats) {
	fmt.Fprintf(e.stdout, "Swept %d expired leases, reaped %d expired records.\n", s.Swept, s.Reaped)
	if s.Completed+s.Released > 0 {
		fmt.Fprintf(e.stdout, "Reconciled %d unknown records: %d completed, %d released.\n", s.Completed+s.Released, s.Completed, s.Released)
	}
	if s.UnknownBacklog > 0 {
		more := ""
		if s.UnknownBacklogTruncated {
			more = " or more"
		}
		fmt.Fprintf(e.stdout, "%d%s unknown records await an operator: 'idem keys list --state unknown', then 'idem keys resolve'.\n",
			s.UnknownBacklog, more)
	}
	if s.ReconcileLeft > 0 {
		fmt.Fprintf(e.stdout, "%d due unknown records had no time in this pass: run it again, or raise --reconcile-concurrency.\n", s.ReconcileLeft)
	}
	if s.OldestInProgress > 0 {
		fmt.Fprintf(e.stdout, "Oldest attempt in progress: %s.\n", roughDuration(s.OldestInProgress))
	}
	if s.PassErrors > 0 {
		fmt.Fprintf(e.stdout, "%d passes failed.\n", s.PassErrors)
	}
}
