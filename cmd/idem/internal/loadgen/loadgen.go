// Package loadgen sends POST requests with Idempotency-Keys to one URL from
// several workers and measures the answers: throughput, latency
// percentiles, and counts by status and by Idempotent-Replayed. It is the
// engine of `idem load`.
//
// A run either gives every request a new key, or follows a plan of Keys
// distinct keys, each sent Duplicates times, in a shuffled order: the mix of
// first requests and retries a service behind idem sees. Duplicates of a key
// may be in flight at the same time, as real retries can be; they are
// answered 409 key-in-use (or wait) like any concurrent retry.
package loadgen

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Config configures a run. Run needs URL and a bound: Duration, Requests,
// or a plan (Keys).
type Config struct {
	// URL receives the POST requests.
	URL string
	// Concurrency is the number of workers, each sending one request at a
	// time. Defaults to 8.
	Concurrency int
	// Duration stops the run: no request starts after it. Zero means no time
	// bound.
	Duration time.Duration
	// Requests stops the run after that many requests. Zero means no count
	// bound.
	Requests int
	// Keys, when positive, is the number of distinct keys of the plan; the
	// run ends with the plan (or earlier, at Duration or Requests). Zero
	// gives every request a new key.
	Keys int
	// Duplicates is how many times the plan sends each key. Defaults to 1.
	Duplicates int
	// Body is the request body. Defaults to DefaultBody.
	Body []byte
	// Header is added to every request. Content-Type defaults to
	// application/json.
	Header http.Header
	// KeyPrefix starts every key. Defaults to "load-" and 8 random hex
	// digits, so that runs against one store do not meet each other's keys.
	KeyPrefix string
	// Timeout bounds each request; a request that runs out counts as an
	// error. Defaults to 30 seconds. It applies to the default Client only.
	Timeout time.Duration
	// Client sends the requests. Defaults to a client whose transport keeps
	// Concurrency idle connections to the host, without a proxy, with
	// Timeout per request; Run closes that client's connections when it
	// returns.
	Client *http.Client
	// Seed seeds the shuffle of the plan. Zero picks a random seed.
	Seed uint64
}

// DefaultBody is the default request body: a ~200-byte JSON payment.
const DefaultBody = `{"customer_id":"cus_8f14e45fceea167a5a36dedd4bea2543","amount_cents":129900,"currency":"EUR",` +
	`"description":"Order 2026-11-25 #48213","metadata":{"order_id":"48213","channel":"web"},"capture":true}`

// Defaults of Config.
const (
	// DefaultConcurrency is the default Config.Concurrency.
	DefaultConcurrency = 8
	// DefaultTimeout is the default Config.Timeout.
	DefaultTimeout = 30 * time.Second
)

// Result is what a run measured.
type Result struct {
	// Requests is the number of requests sent: Responses + Errors.
	Requests int
	// Responses is the number of answers received, whatever their status.
	Responses int
	// Errors counts the requests that got no answer (transport errors,
	// timeouts); FirstError is the first of them.
	Errors     int
	FirstError error
	// Elapsed runs from the first request's start to the last answer.
	Elapsed time.Duration
	// Latency holds the percentiles of the answered requests' latencies,
	// from sending the request to reading the whole answer.
	Latency Latency
	// Status counts the answers by status code.
	Status map[int]int
	// Replayed counts the answers by their Idempotent-Replayed header value;
	// "" counts the answers without it.
	Replayed map[string]int
	// ClientErrors holds, for each 4xx status answered, the body of its
	// first answer (up to MaxErrorBody bytes): what a run whose requests
	// the service refuses shows its user.
	ClientErrors map[int][]byte
	// Keys and Duplicates describe the plan (Keys is 0 for new keys only).
	Keys, Duplicates int
	// Concurrency is the number of workers.
	Concurrency int
}

// Throughput is the number of answers per second.
func (r *Result) Throughput() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Responses) / r.Elapsed.Seconds()
}

// Latency summarises the latencies of a run.
type Latency struct {
	P50, P90, P99, Max, Mean time.Duration
}

// MaxErrorBody bounds the bodies kept in Result.ClientErrors.
const MaxErrorBody = 2048

// ClientErrorShare returns the share of the answers that were 4xx, from 0
// to 1.
func (r *Result) ClientErrorShare() float64 {
	if r.Responses == 0 {
		return 0
	}
	n := 0
	for code, c := range r.Status {
		if code >= 400 && code < 500 {
			n += c
		}
	}
	return float64(n) / float64(r.Responses)
}

// MostCommonClientError returns the 4xx status answered most often (the
// lowest code on a tie) and the body of its first answer; 0 when there was
// none.
func (r *Result) MostCommonClientError() (int, []byte) {
	best := 0
	for code := range r.ClientErrors {
		if best == 0 || r.Status[code] > r.Status[best] || (r.Status[code] == r.Status[best] && code < best) {
			best = code
		}
	}
	return best, r.ClientErrors[best]
}

// HeaderReplayed is the response header counted in Result.Replayed.
const HeaderReplayed = "Idempotent-Replayed"

// withDefaults returns a copy of cfg with every zero field set to its
// default, or an error for an invalid one.
func (cfg *Config) withDefaults() (Config, error) {
	c := *cfg
	switch {
	case c.URL == "":
		return c, errors.New("no URL")
	case c.Concurrency < 0, c.Duration < 0, c.Requests < 0, c.Keys < 0, c.Duplicates < 0, c.Timeout < 0:
		return c, errors.New("negative concurrency, duration, requests, keys, duplicates or timeout")
	case c.Duration == 0 && c.Requests == 0 && c.Keys == 0:
		return c, errors.New("unbounded run: set Duration, Requests or Keys")
	case c.Keys == 0 && c.Duplicates > 1:
		return c, errors.New("duplicates without a number of keys")
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.Duplicates == 0 {
		c.Duplicates = 1
	}
	if c.Body == nil {
		c.Body = []byte(DefaultBody)
	}
	c.Header = c.Header.Clone()
	if c.Header == nil {
		c.Header = make(http.Header)
	}
	if c.Header.Get("Content-Type") == "" {
		c.Header.Set("Content-Type", "application/json")
	}
	if c.KeyPrefix == "" {
		var b [4]byte
		rand.Read(b[:])
		c.KeyPrefix = "load-" + hex.EncodeToString(b[:]) + "-"
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Client == nil {
		c.Client = &http.Client{
			Timeout: c.Timeout,
			Transport: &http.Transport{
				MaxIdleConns:        c.Concurrency,
				MaxIdleConnsPerHost: c.Concurrency,
				IdleConnTimeout:     90 * time.Second,
				DisableCompression:  true,
			},
		}
	}
	if c.Seed == 0 {
		c.Seed = mrand.Uint64()
	}
	return c, nil
}

// plan returns the keys of the requests in order: Keys keys, each
// Duplicates times, shuffled; nil for new keys only.
func (cfg *Config) plan() []string {
	if cfg.Keys == 0 {
		return nil
	}
	keys := make([]string, 0, cfg.Keys*cfg.Duplicates)
	for i := range cfg.Keys {
		k := cfg.KeyPrefix + strconv.Itoa(i)
		for range cfg.Duplicates {
			keys = append(keys, k)
		}
	}
	r := mrand.New(mrand.NewPCG(cfg.Seed, cfg.Seed>>32|1))
	r.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	return keys
}

// worker is one worker's tally, merged at the end.
type worker struct {
	lat        []time.Duration
	status     map[int]int
	clientErrs map[int][]byte
	replayed   map[string]int
	errors     int
	firstErr   error
}

// Run sends the requests until the plan, Requests or Duration ends, or ctx
// ends (requests in flight are then canceled), and returns what it
// measured. It returns an error only for an invalid cfg; failed requests
// are counted in the Result.
func Run(ctx context.Context, cfg *Config) (*Result, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("loadgen: %w", err)
	}
	if cfg.Client == nil {
		// The run's own connections end with it. A connection dialed for a
		// request that another connection took first never carried a
		// request: a server shutting down waits 5 seconds for such a one
		// before it counts it as idle.
		defer c.Client.CloseIdleConnections()
	}
	plan := c.plan()
	limit := int64(c.Requests)
	if plan != nil && (limit == 0 || limit > int64(len(plan))) {
		limit = int64(len(plan))
	}
	// stop ends the issuing of requests: the duration, or ctx. Requests in
	// flight at the duration's end finish and are measured; ctx cancels
	// them.
	stop := ctx
	if c.Duration > 0 {
		var cancel context.CancelFunc
		stop, cancel = context.WithTimeout(ctx, c.Duration)
		defer cancel()
	}
	var next atomic.Int64
	workers := make([]*worker, c.Concurrency)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range workers {
		w := &worker{status: make(map[int]int), replayed: make(map[string]int), clientErrs: make(map[int][]byte)}
		workers[i] = w
		wg.Go(func() {
			for stop.Err() == nil {
				n := next.Add(1) - 1
				if limit > 0 && n >= limit {
					return
				}
				key := c.KeyPrefix + strconv.FormatInt(n, 10)
				if plan != nil {
					key = plan[n]
				}
				w.send(ctx, &c, key)
			}
		})
	}
	// A worker returns when its last request is answered: the run ends
	// with the last answer.
	wg.Wait()
	return merge(workers, time.Since(start), &c), nil
}

// send sends one request with key and tallies its answer.
func (w *worker) send(ctx context.Context, c *Config, key string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL, bytes.NewReader(c.Body))
	if err != nil {
		w.fail(err)
		return
	}
	req.Header = c.Header.Clone()
	req.Header.Set("Idempotency-Key", key)
	start := time.Now()
	resp, err := c.Client.Do(req)
	if err != nil {
		w.fail(err)
		return
	}
	code := resp.StatusCode
	if _, seen := w.clientErrs[code]; !seen && code >= 400 && code < 500 {
		var body []byte
		body, err = io.ReadAll(io.LimitReader(resp.Body, MaxErrorBody))
		w.clientErrs[code] = body
	}
	if err == nil {
		_, err = io.Copy(io.Discard, resp.Body)
	}
	resp.Body.Close()
	if err != nil {
		w.fail(err)
		return
	}
	w.lat = append(w.lat, time.Since(start))
	w.status[resp.StatusCode]++
	w.replayed[resp.Header.Get(HeaderReplayed)]++
}

func (w *worker) fail(err error) {
	w.errors++
	if w.firstErr == nil {
		w.firstErr = err
	}
}

// merge adds up the workers' tallies.
func merge(workers []*worker, elapsed time.Duration, c *Config) *Result {
	r := &Result{
		Elapsed:      elapsed,
		Status:       make(map[int]int),
		Replayed:     make(map[string]int),
		Concurrency:  c.Concurrency,
		Duplicates:   c.Duplicates,
		Keys:         c.Keys,
		ClientErrors: make(map[int][]byte),
	}
	var lat []time.Duration
	for _, w := range workers {
		lat = append(lat, w.lat...)
		for k, n := range w.status {
			r.Status[k] += n
		}
		for k, n := range w.replayed {
			r.Replayed[k] += n
		}
		for code, body := range w.clientErrs {
			if _, ok := r.ClientErrors[code]; !ok {
				r.ClientErrors[code] = body
			}
		}
		r.Errors += w.errors
		if r.FirstError == nil {
			r.FirstError = w.firstErr
		}
	}
	r.Responses = len(lat)
	r.Requests = r.Responses + r.Errors
	r.Latency = summarise(lat)
	return r
}

// summarise returns the percentiles of lat (nearest rank), which it sorts.
func summarise(lat []time.Duration) Latency {
	if len(lat) == 0 {
		return Latency{}
	}
	slices.Sort(lat)
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	return Latency{
		P50:  percentile(lat, 50),
		P90:  percentile(lat, 90),
		P99:  percentile(lat, 99),
		Max:  lat[len(lat)-1],
		Mean: sum / time.Duration(len(lat)),
	}
}

// percentile returns the p-th percentile of sorted by the nearest-rank
// method: the smallest value with at least p% of the values at or below it.
func percentile(sorted []time.Duration, p int) time.Duration {
	rank := (p*len(sorted) + 99) / 100 // ceil(p/100 × n)
	return sorted[max(rank, 1)-1]
}
