//go:build linux

package chaos

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/cmd/idem/internal/proxy"
	"github.com/idem-dev/idem/cmd/idem/internal/storeurl"
	"github.com/idem-dev/idem/idemmaint"
	"github.com/idem-dev/idem/idemstore"
)

// The checker must be able to fail. TestCampaignBrokenStore runs the
// campaign against proxies whose store answers a reservation from a stale
// read, and wants the checker to report what that causes.

// childEnv makes the test binary serve as a proxy around a broken store
// instead of testing (TestMain); its value names the breakage.
const childEnv = "IDEM_CHAOS_CHILD"

// staleReserve is the breakage of TestCampaignBrokenStore.
const staleReserve = "stale-reserve"

// TestCampaignBrokenStore runs the campaign on SQLite with proxies that
// are `idem proxy` (the same middleware, proxy handler and reconciler) but
// whose store, when it finds a key in progress under another attempt's
// live lease, answers as if it had read the record before that attempt
// reserved it: the key is "reserved" again. The checker must report the
// double executions this causes, and the replays that are not the
// original answer some client got.
func TestCampaignBrokenStore(t *testing.T) {
	c := &campaign{t: t, name: "broken-store", seed: campaignSeed(t, 5), dur: 10 * time.Second, store: newSQLiteEnv(t),
		proxyArgv: func(int) []string { return []string{os.Args[0], "-test.run=^$"} },
		proxyEnv:  []string{childEnv + "=" + staleReserve},
	}
	res := c.run()
	requireKinds(t, res, KindDoubleExecution, KindWrongReplay, KindNotLinearizable)
	t.Logf("the checker found %v", anomalyKinds(res.anomalies))
}

// brokenStore is a store that answers a reservation from a stale read:
// it never lets an attempt see another's live lease.
type brokenStore struct {
	idemstore.Store
}

func (s brokenStore) KeyReserve(ctx context.Context, p *idemstore.ReserveParams) (*idemstore.ReserveResult, error) {
	res, err := s.Store.KeyReserve(ctx, p)
	if err != nil || res.Reserved {
		return res, err
	}
	if rec := res.Record; rec.State == idemstore.StateInProgress && rec.Fingerprint == p.Fingerprint {
		stale := *rec
		stale.Token, stale.Attempts = p.Token, rec.Attempts+1
		stale.LockedUntil = time.Now().Add(p.Lease)
		return &idemstore.ReserveResult{Reserved: true, Record: &stale}, nil
	}
	return res, nil
}

// runChild serves as `idem proxy` around a broken store, with the flags
// the campaign gives the proxies, until it is killed.
func runChild() int {
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	fail := func(err error) int {
		logger.Error("chaos child failed", "error", err)
		return 3
	}
	fs := flag.NewFlagSet("proxy", flag.ContinueOnError)
	listen := fs.String("listen", "", "")
	upstream := fs.String("upstream", "", "")
	storeURL := fs.String("store", "", "")
	lease := fs.Duration("lease", 30*time.Second, "")
	maintain := fs.Bool("maintain", false, "")
	reconcileURL := fs.String("reconcile-url", "", "")
	interval := fs.Duration("reconcile-interval", time.Second, "")
	fs.Duration("reconcile-grace", 0, "") // the reconciler here has none
	if err := fs.Parse(os.Args[2:]); err != nil {
		return fail(err)
	}
	if os.Getenv(childEnv) != staleReserve {
		return fail(fmt.Errorf("unknown breakage %q", os.Getenv(childEnv)))
	}
	ctx := context.Background()
	store, closeStore, err := storeurl.Open(ctx, *storeURL)
	if err != nil {
		return fail(err)
	}
	defer closeStore()
	if *maintain {
		tmpl, err := idemmaint.ParseURLTemplate(*reconcileURL)
		if err != nil {
			return fail(err)
		}
		m := idemmaint.New(store, &idemmaint.Config{
			ReconcileInterval: *interval,
			Reconcile:         idemmaint.HTTPReconciler(tmpl, nil),
			Logger:            logger,
		})
		if err := m.Start(ctx); err != nil {
			return fail(err)
		}
		defer m.Stop()
	}
	up, err := url.Parse(*upstream)
	if err != nil {
		return fail(err)
	}
	mw := idem.New(brokenStore{store}, &idem.Config{
		GuardConfig: idem.GuardConfig{Lease: *lease, Logger: logger},

		Endpoint: func(r *http.Request) string { return r.Method + " " + r.URL.EscapedPath() },
	})
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fail(err)
	}
	logger.Info("listening", "addr", ln.Addr().String(), "breakage", staleReserve)
	return fail((&http.Server{Handler: mw(proxy.New(up, &proxy.Config{Logger: logger})), ReadHeaderTimeout: 10 * time.Second}).Serve(ln))
}
