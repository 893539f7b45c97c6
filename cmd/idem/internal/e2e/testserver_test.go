package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/cmd/idem/internal/idembin"
	"github.com/idem-dev/idem/idempgx"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv"
)

// The crash tests run this test binary again as a server process: TestMain
// sees childEnv and serves instead of testing. The other variables configure
// the child.
const (
	childEnv      = "IDEM_E2E_CHILD"      // "tx", "phases" or "mysql-tx"
	childDBEnv    = "IDEM_E2E_DATABASE"   // PostgreSQL URL
	childSchema   = "IDEM_E2E_SCHEMA"     // the test's schema
	childLease    = "IDEM_E2E_LEASE"      // the middleware's lease
	childBlock    = "IDEM_E2E_BLOCK"      // tx: "1" blocks the handler after its insert
	childDown     = "IDEM_E2E_DOWNSTREAM" // phases: base URL of the downstream
	childKillAt   = "IDEM_E2E_KILL"       // phases: where the process kills itself
	childMaxLife  = 2 * time.Minute       // a child outliving its test exits
	ordersPattern = "POST /v1/orders"
)

// phaseNames are the phases of the "phases" child's operation.
var phaseNames = []string{"phase1", "phase2", "phase3"}

// startChild starts this test binary as a server of the given mode on the
// test's schema, with the middleware's lease at 1 s.
func (e *env) startChild(name, mode string, extra map[string]string) *proc {
	e.t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(idembin.Environ(),
		childEnv+"="+mode,
		childDBEnv+"="+testenv.PostgresURL(e.t),
		childSchema+"="+e.schema,
		childLease+"=1s",
	)
	for k, v := range extra {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	return start(e.t, name, cmd)
}

// runChild serves the middleware in transactional mode on POST /v1/orders
// until the process is killed, and returns the exit code of a failure.
func runChild(mode string) int {
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	fail := func(err error) int {
		logger.Error("child failed", "error", err)
		return 3
	}
	time.AfterFunc(childMaxLife, func() {
		logger.Error("child outlived its test")
		os.Exit(4)
	})
	if mode == "mysql-tx" {
		return runMySQLChild(logger)
	}
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(os.Getenv(childDBEnv))
	if err != nil {
		return fail(err)
	}
	cfg.MaxConns = 3
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fail(err)
	}
	schema := os.Getenv(childSchema)
	lease, err := time.ParseDuration(os.Getenv(childLease))
	if err != nil {
		return fail(err)
	}
	var h http.Handler
	switch mode {
	case "tx":
		h = txHandler(logger, schema, os.Getenv(childBlock) == "1")
	case "phases":
		h = phasesHandler(logger, schema, os.Getenv(childDown), os.Getenv(childKillAt))
	default:
		return fail(fmt.Errorf("unknown child mode %q", mode))
	}
	store := idempgx.New(pool, &idempgx.Config{Schema: schema, Logger: logger})
	mux := http.NewServeMux()
	mux.Handle(ordersPattern, idem.New(store, &idem.Config{GuardConfig: idem.GuardConfig{Transactional: true, Lease: lease, Logger: logger}})(h))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fail(err)
	}
	logger.Info("listening", "addr", ln.Addr().String(), "pid", os.Getpid())
	return fail((&http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}).Serve(ln))
}

// txHandler inserts one business row through the request's transaction and
// answers 201 with its id. With block set it logs "blocked" after the insert
// and never answers: the test kills the process there.
func txHandler(logger *slog.Logger, schema string, block bool) http.HandlerFunc {
	rows := pgx.Identifier{schema, "business_rows"}.Sanitize()
	return func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		tx, err := idempgx.TxFromContext(ctx)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		key, _ := idem.KeyFromContext(ctx)
		var id int64
		err = tx.QueryRow(ctx, "INSERT INTO "+rows+" (op_key, pid) VALUES ($1, $2) RETURNING id", key, os.Getpid()).Scan(&id)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if block {
			logger.Info("blocked", "row", id)
			select {} // until SIGKILL
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"row":%d,"pid":%d}`, id, os.Getpid())
	}
}

// phasesHandler runs three atomic phases; each inserts one local row and
// makes one call to the downstream with the phase's derived key. killAt
// names where the process kills itself: "PHASE/called" after the phase's
// external call and before its commit, "PHASE/committed" once the phase has
// committed (at the start of the next phase, or before the answer after the
// last).
func phasesHandler(logger *slog.Logger, schema, downstream, killAt string) http.HandlerFunc {
	writes := pgx.Identifier{schema, "phase_writes"}.Sanitize()
	dc := &http.Client{Timeout: 10 * time.Second}
	maybeKill := func(point string) {
		if point != killAt {
			return
		}
		logger.Warn("killing myself", "at", point)
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	call := func(ctx context.Context, phase string) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, downstream+"/effects", strings.NewReader(`{}`))
		if err != nil {
			return err
		}
		req.Header.Set(idem.HeaderKey, idem.DerivedKeyFromContext(ctx, phase))
		req.Header.Set("X-Phase", phase)
		resp, err := dc.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("downstream answered %s", resp.Status)
		}
		return nil
	}
	return func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		key, _ := idem.KeyFromContext(ctx)
		resumed := idem.RecoveryPoint(ctx)
		phases := make([]idem.Phase, len(phaseNames))
		for i, name := range phaseNames {
			phases[i] = idem.Phase{Name: name, Run: func(ctx context.Context, tx idemstore.Tx) error {
				if i > 0 {
					maybeKill(phaseNames[i-1] + "/committed")
				}
				ptx, ok := idempgx.TxFrom(tx)
				if !ok {
					return fmt.Errorf("the phase's transaction is a %T, not an idempgx one", tx)
				}
				if _, err := ptx.Exec(ctx, "INSERT INTO "+writes+" (op_key, phase, pid) VALUES ($1, $2, $3)", key, name, os.Getpid()); err != nil {
					return err
				}
				if err := call(ctx, name); err != nil {
					return err
				}
				maybeKill(name + "/called")
				return nil
			}}
		}
		if err := idem.RunPhases(ctx, phases...); err != nil {
			logger.Error("phases failed", "error", err)
			http.Error(w, "phases failed", http.StatusInternalServerError)
			return
		}
		maybeKill(phaseNames[len(phaseNames)-1] + "/committed")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%q,"resumed_from":%q,"pid":%d}`, key, resumed, os.Getpid())
	}
}
