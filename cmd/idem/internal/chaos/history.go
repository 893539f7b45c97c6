package chaos

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"sync"
	"time"
)

// Outcome classifies the answer of one attempt as the contract (SPEC
// sections 2 and 3) tells them apart.
type Outcome string

const (
	// OutcomeExecuted is a 2xx the upstream made for this attempt: not
	// replayed, carrying the execution id.
	OutcomeExecuted Outcome = "executed"
	// OutcomeReplayed is a 2xx with Idempotent-Replayed: true.
	OutcomeReplayed Outcome = "replayed"
	// OutcomeFailed is the upstream's own 5xx, forwarded: the execution had
	// no effect and released the key.
	OutcomeFailed Outcome = "failed"
	// OutcomeInUse is 409 key-in-use.
	OutcomeInUse Outcome = "in-use"
	// OutcomeUnknown is 409 outcome-unknown.
	OutcomeUnknown Outcome = "outcome-unknown"
	// OutcomeReused is 422 key-reused.
	OutcomeReused Outcome = "reused"
	// OutcomeUnavailable is 503 store-unavailable: the proxy failed closed.
	OutcomeUnavailable Outcome = "unavailable"
	// OutcomeLeaseLost is 503 lease-lost: the attempt reserved the key,
	// then gave up its lease (it was paused, or cut off from its store)
	// before its request left, or while it was on its way.
	OutcomeLeaseLost Outcome = "lease-lost"
	// OutcomeGateway is the proxy's own 502 or 504: the upstream exchange
	// failed; the key is released (never sent) or unknown.
	OutcomeGateway Outcome = "gateway"
	// OutcomeNone is no answer: a refused or broken connection, the
	// client's hang-up or its deadline.
	OutcomeNone Outcome = "none"
	// OutcomeOther is any other answer: outside the contract.
	OutcomeOther Outcome = "other"
)

// final reports whether an outcome ends an operation: the client needs no
// retry.
func (o Outcome) final() bool {
	return o == OutcomeExecuted || o == OutcomeReplayed || o == OutcomeReused
}

// Attempt is one HTTP request of a client: one try of an operation, sent to
// one proxy. Its ID travels to the upstream in the AttemptHeader, so an
// execution names the attempt that caused it.
type Attempt struct {
	ID     int    `json:"id"`
	Op     int    `json:"op"`
	Worker int    `json:"worker"`
	Key    string `json:"key"`
	// Body names the request body sent with the key ("a" or "b"): two
	// bodies, two fingerprints.
	Body  string    `json:"body"`
	Proxy int       `json:"proxy"`
	Call  time.Time `json:"call"`
	// Return is when the answer was read; zero when there was none.
	Return   time.Time `json:"return,omitzero"`
	Outcome  Outcome   `json:"outcome"`
	Status   int       `json:"status,omitempty"`
	Replayed bool      `json:"replayed,omitempty"`
	Code     string    `json:"code,omitempty"`
	// Exec is the execution id in the body of a 2xx or of the upstream's
	// 5xx.
	Exec string `json:"exec,omitempty"`
	// Err is the transport error, or why the client gave up.
	Err string `json:"err,omitempty"`
	// HungUp reports that the client hung up on purpose before the answer.
	HungUp bool `json:"hung_up,omitempty"`
}

func (a *Attempt) answered() bool { return !a.Return.IsZero() }

func (a *Attempt) String() string {
	ans := string(a.Outcome)
	if a.Status != 0 {
		ans = fmt.Sprintf("%s %d", ans, a.Status)
	}
	if a.Code != "" {
		ans += " " + a.Code
	}
	if a.Exec != "" {
		ans += " exec=" + a.Exec
	}
	if a.Err != "" {
		ans += " (" + a.Err + ")"
	}
	end := "-"
	if a.answered() {
		end = stamp(a.Return)
	}
	return fmt.Sprintf("attempt %d (op %d, worker %d, body %s) via proxy %d [%s, %s]: %s",
		a.ID, a.Op, a.Worker, a.Body, a.Proxy, stamp(a.Call), end, ans)
}

// Execution is one request the upstream received and ran.
type Execution struct {
	ID   string `json:"id"`
	Key  string `json:"key"`
	Body string `json:"body"`
	// Attempt is the client attempt that caused it (its AttemptHeader); 0
	// when the header was missing.
	Attempt int `json:"attempt"`
	// Fence is the Idempotency-Attempt header (the attempt's fencing
	// token), when the proxy sends one.
	Fence string    `json:"fence,omitempty"`
	Start time.Time `json:"start"`
	// End is when the upstream answered; zero while it runs.
	End    time.Time `json:"end,omitzero"`
	Status int       `json:"status,omitempty"`
}

// Void reports whether the execution had no effect: the upstream answered
// a status that releases the key (5xx, 408, 425, 429), which it only does
// for a request it did not apply.
func (e *Execution) Void() bool { return !e.End.IsZero() && releases(e.Status) }

func (e *Execution) String() string {
	end, what := "running", ""
	if !e.End.IsZero() {
		end = stamp(e.End)
		what = fmt.Sprintf(" answered %d", e.Status)
		if e.Void() {
			what += " (void)"
		}
	}
	return fmt.Sprintf("execution %s of attempt %d (body %s) [%s, %s]%s", e.ID, e.Attempt, e.Body, stamp(e.Start), end, what)
}

// releases reports whether the middleware releases a key on this status.
func releases(status int) bool {
	return status >= 500 || status == 408 || status == 425 || status == 429
}

// Lookup is one reconciliation lookup the upstream answered.
type Lookup struct {
	Key    string    `json:"key"`
	At     time.Time `json:"at"`
	Status int       `json:"status"`
	Exec   string    `json:"exec,omitempty"`
}

func (l *Lookup) String() string {
	s := fmt.Sprintf("lookup at %s answered %d", stamp(l.At), l.Status)
	if l.Exec != "" {
		s += " exec=" + l.Exec
	}
	return s
}

// Final is a key's record as the store holds it once the campaign is over.
type Final struct {
	// State is the record's state; "" when there is no record.
	State string `json:"state"`
	// Fingerprint is the record's request fingerprint.
	Fingerprint string `json:"fingerprint,omitempty"`
	// Exec is the execution id in the stored response.
	Exec string `json:"exec,omitempty"`
}

// Fault is one fault the scheduler injected.
type Fault struct {
	Kind   string    `json:"kind"`
	Target string    `json:"target"`
	Start  time.Time `json:"start"`
	End    time.Time `json:"end,omitzero"`
}

// History is everything a campaign recorded: every attempt, execution and
// lookup, the faults, and the final records. It is safe for concurrent use
// while the campaign runs.
type History struct {
	mu         sync.Mutex
	Begin      time.Time        `json:"begin"`
	Attempts   []*Attempt       `json:"attempts"`
	Executions []*Execution     `json:"executions"`
	Lookups    []*Lookup        `json:"lookups"`
	Faults     []*Fault         `json:"faults"`
	Finals     map[string]Final `json:"finals"`
}

// NewHistory returns an empty history that starts now.
func NewHistory() *History {
	return &History{Begin: time.Now(), Finals: make(map[string]Final)}
}

// Invoke records the start of an attempt and returns it with its id; the
// caller fills in the answer and passes it to Complete.
func (h *History) Invoke(op, worker int, key, body string, proxy int) *Attempt {
	h.mu.Lock()
	defer h.mu.Unlock()
	a := &Attempt{ID: len(h.Attempts) + 1, Op: op, Worker: worker, Key: key, Body: body, Proxy: proxy, Call: time.Now()}
	h.Attempts = append(h.Attempts, a)
	return a
}

// Complete records the answer of an attempt.
func (h *History) Complete(a *Attempt, answer Attempt) {
	h.mu.Lock()
	defer h.mu.Unlock()
	a.Return, a.Outcome, a.Status, a.Replayed = answer.Return, answer.Outcome, answer.Status, answer.Replayed
	a.Code, a.Exec, a.Err, a.HungUp = answer.Code, answer.Exec, answer.Err, answer.HungUp
}

// Executed records the start of an execution and returns it.
func (h *History) Executed(key, body string, attempt int, fence string) *Execution {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := &Execution{ID: fmt.Sprintf("x%d", len(h.Executions)+1), Key: key, Body: body, Attempt: attempt, Fence: fence, Start: time.Now()}
	h.Executions = append(h.Executions, e)
	return e
}

// Answered records the upstream's answer to an execution.
func (h *History) Answered(e *Execution, status int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e.End, e.Status = time.Now(), status
}

// LookedUp records a reconciliation lookup.
func (h *History) LookedUp(l Lookup) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.Lookups = append(h.Lookups, &l)
}

// Injected records the start of a fault; the caller ends it with Healed.
func (h *History) Injected(kind, target string) *Fault {
	h.mu.Lock()
	defer h.mu.Unlock()
	f := &Fault{Kind: kind, Target: target, Start: time.Now()}
	h.Faults = append(h.Faults, f)
	return f
}

// Healed records the end of a fault.
func (h *History) Healed(f *Fault) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f.End = time.Now()
}

// SetFinal records a key's final record.
func (h *History) SetFinal(key string, f Final) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.Finals[key] = f
}

// KeyState reports what the upstream knows of key: the execution that
// applied it (finished with a status that does not release), or whether an
// execution of it is still running. It answers the reconciler's lookup.
func (h *History) KeyState(key string) (applied *Execution, running bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, e := range h.Executions {
		if e.Key != key {
			continue
		}
		switch {
		case e.End.IsZero():
			running = true
		case !e.Void() && applied == nil:
			applied = e
		}
	}
	return applied, running
}

// Keys returns every key an attempt used, sorted.
func (h *History) Keys() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	seen := make(map[string]bool)
	var keys []string
	for _, a := range h.Attempts {
		if !seen[a.Key] {
			seen[a.Key] = true
			keys = append(keys, a.Key)
		}
	}
	sort.Strings(keys)
	return keys
}

// Counts reports how many attempts, executions and faults the history
// holds so far.
func (h *History) Counts() (attempts, executions, faults int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.Attempts), len(h.Executions), len(h.Faults)
}

// keyHistory is one key's part of a history, each list in time order.
type keyHistory struct {
	key        string
	attempts   []*Attempt
	executions []*Execution
	lookups    []*Lookup
	final      Final
	hasFinal   bool
}

// byKey splits the history by key.
func (h *History) byKey() map[string]*keyHistory {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]*keyHistory)
	get := func(key string) *keyHistory {
		kh := out[key]
		if kh == nil {
			kh = &keyHistory{key: key}
			out[key] = kh
		}
		return kh
	}
	for _, a := range h.Attempts {
		kh := get(a.Key)
		kh.attempts = append(kh.attempts, a)
	}
	for _, e := range h.Executions {
		kh := get(e.Key)
		kh.executions = append(kh.executions, e)
	}
	for _, l := range h.Lookups {
		kh := get(l.Key)
		kh.lookups = append(kh.lookups, l)
	}
	for k, f := range h.Finals {
		kh := get(k)
		kh.final, kh.hasFinal = f, true
	}
	for _, kh := range out {
		sort.SliceStable(kh.attempts, func(i, j int) bool { return kh.attempts[i].Call.Before(kh.attempts[j].Call) })
		sort.SliceStable(kh.executions, func(i, j int) bool { return kh.executions[i].Start.Before(kh.executions[j].Start) })
		sort.SliceStable(kh.lookups, func(i, j int) bool { return kh.lookups[i].At.Before(kh.lookups[j].At) })
	}
	return out
}

// String lists the key's history, one event a line, for anomaly reports.
func (kh *keyHistory) String() string {
	type line struct {
		at   time.Time
		text string
	}
	var lines []line
	for _, a := range kh.attempts {
		lines = append(lines, line{a.Call, a.String()})
	}
	for _, e := range kh.executions {
		lines = append(lines, line{e.Start, e.String()})
	}
	for _, l := range kh.lookups {
		lines = append(lines, line{l.At, l.String()})
	}
	sort.SliceStable(lines, func(i, j int) bool { return lines[i].at.Before(lines[j].at) })
	s := fmt.Sprintf("key %s:\n", kh.key)
	for _, l := range lines {
		s += "  " + l.text + "\n"
	}
	if kh.hasFinal {
		s += fmt.Sprintf("  final record: %q exec=%s\n", kh.final.State, kh.final.Exec)
	}
	return s
}

// WriteJSON writes the history as JSON.
func (h *History) WriteJSON(w io.Writer) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	enc := json.NewEncoder(w)
	enc.SetIndent("", " ")
	return enc.Encode(h)
}

// stamp formats a time for reports: wall clock to the millisecond.
func stamp(t time.Time) string { return t.Format("15:04:05.000") }

// executionsPerKey counts the executions of every key that may have had an
// effect (not void), under the lock.
func (h *History) executionsPerKey() map[string]int {
	n := make(map[string]int)
	for _, e := range h.Executions {
		if !e.Void() {
			n[e.Key]++
		}
	}
	return n
}

// DoubleExecutions counts the keys executed more than once so far, void
// executions aside: the campaign's progress line.
func (h *History) DoubleExecutions() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	d := 0
	for _, n := range h.executionsPerKey() {
		if n > 1 {
			d++
		}
	}
	return d
}

// MaxExecutionsPerKey is the most executions any key had, void ones aside.
func (h *History) MaxExecutionsPerKey() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := 0
	for _, n := range h.executionsPerKey() {
		m = max(m, n)
	}
	return m
}
