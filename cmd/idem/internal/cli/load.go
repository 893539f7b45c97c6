package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idem-dev/idem/cmd/idem/internal/loadgen"
)

// loadOptions are the settings of `idem load`.
type loadOptions struct {
	target      string
	token       string
	url         *url.URL
	concurrency int
	duration    time.Duration
	requests    int
	keys        int
	duplicates  int
	body        string
	header      http.Header
	timeout     time.Duration
	json        bool
	allowRemote bool
}

// defaultLoadDuration bounds a run that sets neither --duration, --requests
// nor --keys.
const defaultLoadDuration = 10 * time.Second

// Targets of `idem load --target`: a preset of the URL and the body.
const (
	loadTargetAny      = "any"      // --url required, loadgen.DefaultBody
	loadTargetPayments = "payments" // idem payments on its default address
)

// paymentsLoadURL and paymentsLoadBody are what --target payments sends:
// `idem payments` at its default address, a body it accepts.
const (
	paymentsLoadURL  = "http://127.0.0.1:8080/v1/payments"
	paymentsLoadBody = `{"customer_id":"cus_load","amount_cents":1999,"currency":"EUR"}`
)

const loadAbout = "Sends POST requests with Idempotency-Keys to URL from --concurrency workers\n" +
	"and reports the throughput, the latency percentiles (p50, p90, p99, max) and\n" +
	"the answers counted by status and by Idempotent-Replayed. Without --keys every\n" +
	"request has a new key; with --keys K --duplicates R the run sends K keys R\n" +
	"times each, shuffled: first requests and retries, duplicates possibly in\n" +
	"flight together (answered 409 key-in-use, or after --wait, by idem). The run\n" +
	"ends with the plan, at --requests or at --duration (default 10s without\n" +
	"a plan); requests in flight then finish and are measured. Only loopback\n" +
	"hosts are accepted unless --allow-remote: it is a benchmark tool.\n\n" +
	"--target payments fits `idem payments`: the URL defaults to " + paymentsLoadURL + ",\n" +
	"the body to a payment it accepts, and --token sends the bearer token its\n" +
	"banner prints. When most answers are 4xx, the report shows the first answer's\n" +
	"body and a hint."

func parseLoad(args []string, e *env) (*loadOptions, error) {
	o := &loadOptions{
		target:      loadTargetAny,
		duration:    defaultLoadDuration,
		concurrency: loadgen.DefaultConcurrency,
		duplicates:  1,
		body:        loadgen.DefaultBody,
		header:      make(http.Header),
		timeout:     loadgen.DefaultTimeout,
	}
	fs := newFlagSet("load", "idem load --url URL | --target payments [--token TOKEN] [--concurrency N] [--duration D | --requests N] [--keys K] [--duplicates R] [--body JSON] [--header 'K: V'] [--json]", loadAbout)
	fs.Var(oneOfValue{&o.target, []string{loadTargetAny, loadTargetPayments}}, "target", "`KIND` of service: any (--url required) or payments (idem payments: its URL and a body it accepts)")
	fs.Var(httpURLValue{&o.url}, "url", "`URL` the requests are POSTed to (required unless --target payments)")
	fs.Var(secretValue{&o.token}, "token", "bearer `TOKEN` sent as Authorization (idem payments prints one in its banner)")
	fs.Var(countValue{&o.concurrency}, "concurrency", "`N` workers, each with one request in flight")
	fs.Var(durationValue{p: &o.duration}, "duration", "`DURATION` of the run; no request starts after it (without --requests or --keys)")
	fs.Var(countValue{&o.requests}, "requests", "`N` requests, then stop")
	fs.Var(countValue{&o.keys}, "keys", "`K` distinct keys (0: a new key for every request)")
	fs.Var(countValue{&o.duplicates}, "duplicates", "`R` requests per key of --keys")
	fs.StringVar(&o.body, "body", "", "request `JSON` body (default: a ~200-byte payment; with --target payments, one it accepts)")
	fs.Var(headerValue{o.header}, "header", "request header `'NAME: VALUE'`, repeatable")
	fs.Var(durationValue{p: &o.timeout}, "timeout", "`DURATION` a request may take before it counts as an error")
	fs.BoolVar(&o.json, "json", false, "print the report as one JSON object")
	fs.BoolVar(&o.allowRemote, "allow-remote", false, "accept a --url whose host is not a loopback address")
	o.duration = 0 // set below unless --duration (or its variable) sets it
	if err := fs.parse(args, e); err != nil {
		return nil, err
	}
	given := make(map[string]bool)
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if o.target == loadTargetPayments {
		if o.url == nil {
			o.url, _ = url.Parse(paymentsLoadURL)
		}
		if o.body == "" {
			o.body = paymentsLoadBody
		}
	}
	if o.body == "" {
		o.body = loadgen.DefaultBody
	}
	if o.token != "" {
		if o.header.Get("Authorization") != "" {
			return nil, usageErrorf("--token and an Authorization --header are exclusive")
		}
		o.header.Set("Authorization", "Bearer "+o.token)
	}
	switch {
	case o.url == nil:
		return nil, usageErrorf("--url (or %s) is required, or --target payments", envName("url"))
	case !o.allowRemote && !isLoopback(o.url.Hostname()):
		return nil, usageErrorf("%s is not a loopback host; pass --allow-remote to load it", o.url.Hostname())
	case o.concurrency == 0:
		return nil, usageErrorf("--concurrency must be positive")
	case o.duplicates == 0:
		return nil, usageErrorf("--duplicates must be positive")
	case o.duplicates > 1 && o.keys == 0:
		return nil, usageErrorf("--duplicates needs --keys")
	case o.duration > 0 && o.requests > 0:
		return nil, usageErrorf("--duration and --requests are exclusive")
	case given["requests"] && o.requests == 0:
		return nil, usageErrorf("--requests must be positive")
	}
	if o.duration == 0 && o.requests == 0 && o.keys == 0 {
		o.duration = defaultLoadDuration
	}
	return o, nil
}

// isLoopback reports whether host (a URL's host name) is localhost or a
// loopback IP address.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// headerValue is a repeatable 'Name: value' request header.
type headerValue struct{ h http.Header }

func (v headerValue) String() string {
	if v.h == nil {
		return ""
	}
	var lines []string
	for _, name := range slices.Sorted(maps.Keys(v.h)) {
		for _, value := range v.h[name] {
			lines = append(lines, name+": "+value)
		}
	}
	return strings.Join(lines, ", ")
}

func (v headerValue) Set(s string) error {
	name, value, ok := strings.Cut(s, ":")
	name = strings.TrimSpace(name)
	if !ok || !isToken(name) {
		return errors.New("want 'Name: value'")
	}
	if strings.EqualFold(name, "Idempotency-Key") {
		return errors.New("the keys are idem load's own (see --keys)")
	}
	v.h.Add(name, strings.TrimSpace(value))
	return nil
}

func runLoad(ctx context.Context, e *env, args []string) error {
	o, err := parseLoad(args, e)
	if err != nil {
		return err
	}
	res, err := loadgen.Run(ctx, &loadgen.Config{
		URL:         o.url.String(),
		Concurrency: o.concurrency,
		Duration:    o.duration,
		Requests:    o.requests,
		Keys:        o.keys,
		Duplicates:  o.duplicates,
		Body:        []byte(o.body),
		Header:      o.header,
		Timeout:     o.timeout,
	})
	if err != nil {
		return err
	}
	if o.json {
		err = writeLoadJSON(e.stdout, o, res)
	} else {
		err = writeLoadText(e.stdout, o, res)
	}
	if err != nil {
		return err
	}
	if res.ClientErrorShare() > 0.5 {
		code, body := res.MostCommonClientError()
		fmt.Fprintf(e.stderr, "idem load: %.0f%% of the answers were 4xx; the first %d said:\n  %s\n%s",
			100*res.ClientErrorShare(), code, bytes.TrimSpace(body), loadHint(o, code))
	}
	if res.Responses == 0 && res.Requests > 0 {
		return fmt.Errorf("no request was answered: %w", res.FirstError)
	}
	return nil
}

// loadHint says what to change when most answers were the 4xx code.
func loadHint(o *loadOptions, code int) string {
	switch {
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		if o.token == "" {
			return "hint: the service wants a credential: --token TOKEN (idem payments prints its demo token in its banner)\n"
		}
		return "hint: the service refuses --token: copy the token idem payments printed, or the one given to its --tokens\n"
	case code == http.StatusUnprocessableEntity || code == http.StatusBadRequest || code == http.StatusUnsupportedMediaType:
		if o.target != loadTargetPayments && strings.HasSuffix(o.url.Path, "/v1/payments") {
			return "hint: the service refuses the body: --target payments sends a payment idem payments accepts, or set --body\n"
		}
		return "hint: the service refuses the body: set --body to a request it accepts\n"
	case code == http.StatusConflict:
		return "hint: duplicates met their first request in flight (409 key-in-use): fewer --duplicates, or the proxy's --wait\n"
	case code == http.StatusNotFound || code == http.StatusMethodNotAllowed:
		return "hint: nothing takes POST at --url: check its path\n"
	}
	return "hint: check --url, --body and --header against what the service expects\n"
}

// replayedName is how the reports name a value of Idempotent-Replayed.
func replayedName(v string) string {
	if v == "" {
		return "absent"
	}
	return v
}

func writeLoadText(w io.Writer, o *loadOptions, r *loadgen.Result) error {
	var b strings.Builder
	fmt.Fprintf(&b, "target      POST %s\n", o.url.Redacted())
	if r.Keys > 0 {
		fmt.Fprintf(&b, "keys        %d distinct, each sent %d times, shuffled\n", r.Keys, r.Duplicates)
	} else {
		fmt.Fprintf(&b, "keys        a new key for every request\n")
	}
	fmt.Fprintf(&b, "requests    %d in %v with %d workers: %.1f answers/s\n",
		r.Requests, r.Elapsed.Round(time.Millisecond), r.Concurrency, r.Throughput())
	if r.Errors > 0 {
		fmt.Fprintf(&b, "errors      %d without an answer; first: %v\n", r.Errors, r.FirstError)
	}
	l := r.Latency
	us := func(d time.Duration) time.Duration { return d.Round(time.Microsecond) }
	fmt.Fprintf(&b, "latency     p50 %v  p90 %v  p99 %v  max %v  mean %v\n", us(l.P50), us(l.P90), us(l.P99), us(l.Max), us(l.Mean))
	b.WriteString("status     ")
	for _, code := range slices.Sorted(maps.Keys(r.Status)) {
		fmt.Fprintf(&b, " %d: %d", code, r.Status[code])
	}
	b.WriteString("\nreplayed   ")
	for _, v := range slices.Sorted(maps.Keys(r.Replayed)) {
		fmt.Fprintf(&b, " %s: %d", replayedName(v), r.Replayed[v])
	}
	b.WriteString("\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// loadReport is the report `idem load --json` prints. Latencies are in
// milliseconds.
type loadReport struct {
	URL         string         `json:"url"`
	Concurrency int            `json:"concurrency"`
	Keys        int            `json:"keys"`
	Duplicates  int            `json:"duplicates"`
	Requests    int            `json:"requests"`
	Responses   int            `json:"responses"`
	Errors      int            `json:"errors"`
	FirstError  string         `json:"first_error,omitempty"`
	Seconds     float64        `json:"elapsed_seconds"`
	Throughput  float64        `json:"throughput_per_second"`
	LatencyMS   loadLatency    `json:"latency_ms"`
	Status      map[string]int `json:"status"`
	Replayed    map[string]int `json:"replayed"`
}

type loadLatency struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
	Mean float64 `json:"mean"`
}

func writeLoadJSON(w io.Writer, o *loadOptions, r *loadgen.Result) error {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	rep := loadReport{
		URL:         o.url.Redacted(),
		Concurrency: r.Concurrency,
		Keys:        r.Keys,
		Duplicates:  r.Duplicates,
		Requests:    r.Requests,
		Responses:   r.Responses,
		Errors:      r.Errors,
		Seconds:     r.Elapsed.Seconds(),
		Throughput:  r.Throughput(),
		LatencyMS: loadLatency{P50: ms(r.Latency.P50), P90: ms(r.Latency.P90), P99: ms(r.Latency.P99),
			Max: ms(r.Latency.Max), Mean: ms(r.Latency.Mean)},
		Status:   make(map[string]int),
		Replayed: make(map[string]int),
	}
	if r.FirstError != nil {
		rep.FirstError = r.FirstError.Error()
	}
	for code, n := range r.Status {
		rep.Status[strconv.Itoa(code)] = n
	}
	for v, n := range r.Replayed {
		rep.Replayed[replayedName(v)] = n
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}
