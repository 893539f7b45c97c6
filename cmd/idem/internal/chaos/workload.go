package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/cmd/idem/internal/proxy"
)

// Path is where the clients send their operations.
const Path = "/v1/orders"

// Endpoint is the record endpoint of every operation (method and path).
const Endpoint = "POST " + Path

// Workload is the clients of a campaign: Workers goroutines, each running
// operations one after another until Stop, each operation a key and a body
// retried through any proxy until a final answer (executed, replayed,
// reused) or its deadline. Some operations reuse an earlier key with the
// other body; some are sent by two clients at once (a retry racing the
// original); some attempts hang up before the answer.
type Workload struct {
	History *History
	// Proxies are the proxies' base URLs.
	Proxies []string
	// Seed draws every random choice; Prefix starts every key.
	Seed   uint64
	Prefix string
	// Workers is the number of concurrent clients. Defaults to 8.
	Workers int
	// ReuseRate is the share of operations that reuse an earlier key with
	// its other body. Defaults to 0.1.
	ReuseRate float64
	// DuplicateRate is the share of operations two clients send at once.
	// Defaults to 0.15.
	DuplicateRate float64
	// RecheckRate is the share of operations whose client, once answered,
	// sends the request once more (it did not trust the answer): a replay.
	// Defaults to 0.15.
	RecheckRate float64
	// HangupRate is the share of attempts the client hangs up on, after
	// up to 50 ms. Defaults to 0.05; Lose raises it for a while.
	HangupRate float64
	// AttemptTimeout bounds one attempt. Defaults to 3 s.
	AttemptTimeout time.Duration
	// OpTimeout bounds one operation once Stop was called. Defaults to 30 s.
	OpTimeout time.Duration

	client *http.Client
	losing atomic.Bool
	ops    atomic.Int64
	done   atomic.Int64 // operations ended with a final answer
	gaveUp atomic.Int64

	mu    sync.Mutex
	reuse []string // keys whose first body completed, for reuse
}

func (w *Workload) defaults() {
	if w.Workers <= 0 {
		w.Workers = 8
	}
	if w.ReuseRate == 0 {
		w.ReuseRate = 0.1
	}
	if w.DuplicateRate == 0 {
		w.DuplicateRate = 0.15
	}
	if w.RecheckRate == 0 {
		w.RecheckRate = 0.15
	}
	if w.HangupRate == 0 {
		w.HangupRate = 0.05
	}
	if w.AttemptTimeout <= 0 {
		w.AttemptTimeout = 3 * time.Second
	}
	if w.OpTimeout <= 0 {
		w.OpTimeout = 30 * time.Second
	}
	w.client = &http.Client{Transport: &http.Transport{
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     2 * time.Second,
	}}
}

// Lose makes the clients hang up on most attempts (on) or stops it (off):
// the fault of answers lost on the client's side.
func (w *Workload) Lose(on bool) { w.losing.Store(on) }

// Stats reports the operations started, those that got a final answer and
// those that gave up at their deadline.
func (w *Workload) Stats() (ops, done, gaveUp int64) {
	return w.ops.Load(), w.done.Load(), w.gaveUp.Load()
}

// Run runs the workers until stop is closed and each has finished its
// operation; ctx ends everything at once.
func (w *Workload) Run(ctx context.Context, stop <-chan struct{}) {
	w.defaults()
	var wg sync.WaitGroup
	for i := range w.Workers {
		wg.Go(func() { w.worker(ctx, stop, i) })
	}
	wg.Wait()
	w.client.CloseIdleConnections()
}

func (w *Workload) worker(ctx context.Context, stop <-chan struct{}, id int) {
	rng := rand.New(rand.NewPCG(w.Seed, uint64(id)+1))
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		default:
		}
		op := int(w.ops.Add(1))
		key, body := fmt.Sprintf("%s-%d", w.Prefix, op), "a"
		if rng.Float64() < w.ReuseRate {
			w.mu.Lock()
			if n := len(w.reuse); n > 0 {
				key, body = w.reuse[rng.IntN(n)], "b"
			}
			w.mu.Unlock()
		}
		clients := 1
		if rng.Float64() < w.DuplicateRate {
			clients = 2
		}
		var wg sync.WaitGroup
		results := make([]Outcome, clients)
		for c := range clients {
			seed := rng.Uint64()
			wg.Go(func() {
				results[c] = w.operation(ctx, stop, op, id*2+c, key, body, rand.New(rand.NewPCG(seed, 7)))
			})
		}
		wg.Wait()
		final := false
		for _, o := range results {
			final = final || o.final()
		}
		if final && rng.Float64() < w.RecheckRate {
			a := w.History.Invoke(op, id*2, key, body, rng.IntN(len(w.Proxies)))
			w.History.Complete(a, w.attempt(ctx, a, rng))
		}
		if final {
			w.done.Add(1)
		} else {
			w.gaveUp.Add(1)
		}
		if body == "a" && (results[0] == OutcomeExecuted || results[0] == OutcomeReplayed) {
			w.mu.Lock()
			w.reuse = append(w.reuse, key)
			w.mu.Unlock()
		}
	}
}

// operation retries one operation until a final answer, or until its
// deadline once stop is closed, and returns the last outcome.
func (w *Workload) operation(ctx context.Context, stop <-chan struct{}, op, worker int, key, body string, rng *rand.Rand) Outcome {
	var deadline <-chan time.Time
	for {
		proxy := rng.IntN(len(w.Proxies))
		a := w.History.Invoke(op, worker, key, body, proxy)
		out := w.attempt(ctx, a, rng)
		w.History.Complete(a, out)
		if out.Outcome.final() {
			return out.Outcome
		}
		if deadline == nil {
			select {
			case <-stop:
				t := time.NewTimer(w.OpTimeout)
				defer t.Stop()
				deadline = t.C
			default:
			}
		}
		pause := time.NewTimer(time.Duration(20+rng.IntN(180)) * time.Millisecond)
		select {
		case <-ctx.Done():
			pause.Stop()
			return out.Outcome
		case <-deadline:
			pause.Stop()
			return out.Outcome
		case <-pause.C:
		}
	}
}

// attempt sends one request and classifies its answer.
func (w *Workload) attempt(ctx context.Context, a *Attempt, rng *rand.Rand) Attempt {
	hangup := rng.Float64() < w.HangupRate || (w.losing.Load() && rng.Float64() < 0.7)
	timeout := w.AttemptTimeout
	if hangup {
		timeout = time.Duration(1+rng.IntN(50)) * time.Millisecond
	}
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	payload, _ := json.Marshal(requestBody{Key: a.Key, Body: a.Body})
	req, err := http.NewRequestWithContext(actx, http.MethodPost, w.Proxies[a.Proxy]+Path, strings.NewReader(string(payload)))
	if err != nil {
		return Attempt{Outcome: OutcomeOther, Err: err.Error()}
	}
	req.Header.Set(idem.HeaderKey, a.Key)
	req.Header.Set(AttemptHeader, strconv.Itoa(a.ID))
	req.Header.Set("Content-Type", "application/json")
	resp, err := w.client.Do(req)
	if err != nil {
		return Attempt{Outcome: OutcomeNone, Err: errText(err), HungUp: hangup && errors.Is(err, context.DeadlineExceeded)}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return Attempt{Outcome: OutcomeNone, Err: errText(err), HungUp: hangup}
	}
	out := classify(resp, b)
	out.Return = time.Now()
	return out
}

func errText(err error) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return "no answer in time"
	}
	return err.Error()
}

// classify tells an answer's outcome.
func classify(resp *http.Response, b []byte) Attempt {
	out := Attempt{Status: resp.StatusCode, Replayed: resp.Header.Get(idem.HeaderReplayed) == "true"}
	ct := resp.Header.Get("Content-Type")
	switch {
	case ct == "application/json":
		var ans answerBody
		if json.Unmarshal(b, &ans) != nil || ans.Execution == "" {
			out.Outcome, out.Err = OutcomeOther, fmt.Sprintf("body %.100q", b)
			return out
		}
		out.Exec = ans.Execution
		switch {
		case resp.StatusCode/100 == 2 && out.Replayed:
			out.Outcome = OutcomeReplayed
		case resp.StatusCode/100 == 2:
			out.Outcome = OutcomeExecuted
		case resp.StatusCode == http.StatusInternalServerError && !out.Replayed:
			out.Outcome = OutcomeFailed
		default:
			out.Outcome = OutcomeOther
		}
	case ct == "application/problem+json":
		var p idem.Problem
		_ = json.Unmarshal(b, &p)
		out.Code = p.Code
		switch {
		case resp.StatusCode == http.StatusConflict && p.Code == idem.CodeKeyInUse:
			out.Outcome = OutcomeInUse
		case resp.StatusCode == http.StatusConflict && p.Code == idem.CodeOutcomeUnknown:
			out.Outcome = OutcomeUnknown
		case resp.StatusCode == http.StatusUnprocessableEntity && p.Code == idem.CodeKeyReused:
			out.Outcome = OutcomeReused
		case resp.StatusCode == http.StatusServiceUnavailable && p.Code == idem.CodeStoreUnavailable:
			out.Outcome = OutcomeUnavailable
		case resp.StatusCode == http.StatusServiceUnavailable && p.Code == proxy.CodeLeaseLost:
			out.Outcome = OutcomeLeaseLost
		case (resp.StatusCode == http.StatusBadGateway || resp.StatusCode == http.StatusGatewayTimeout) &&
			strings.HasPrefix(p.Code, "upstream-"):
			out.Outcome = OutcomeGateway
		default:
			out.Outcome, out.Err = OutcomeOther, p.Detail
		}
	default:
		out.Outcome, out.Err = OutcomeOther, fmt.Sprintf("%s %.100q", ct, b)
	}
	return out
}
