package chaos

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// The model of one key's record, as SPEC sections 2 and 3 describe it, for
// porcupine.
//
// A client's attempt is not atomic: it reserves the key, the upstream runs,
// the record is completed. So an attempt that reserved (its answer says so)
// is two operations over its whole interval, a reserve and a finish, and
// what the finish reports (the attempt's own execution) needs that
// reserve. The
// upstream's executions are operations too, each naming its attempt (the
// AttemptHeader): an execution is legal only while its attempt holds the
// lease and nothing was applied yet. Between operations the record may move
// by itself as the contract allows and no client sees (the closure): a
// lease expires (in progress → unknown), the attempt that applied the key
// completes it, the reconciler settles an unknown record by what the
// upstream did (completed when something was applied, released when
// nothing was), an attempt whose execution was void releases it.
//
// What it rules out, among others: an execution after one that applied the
// key, or by an attempt whose lease is gone (the pause defect); a replay of
// anything but the applied execution, or before it; 409 key-in-use or
// outcome-unknown once a completion was replayed; 422 key-reused before
// the other body reserved the key. An execution takes effect at one point
// of its interval, so an execution that overlaps a void one is left to the
// direct check (checkKey). The model is the durable contract: a record
// never disappears, so a store that loses one shows as a history it
// rejects, but for the one an attempt drops when it gave up its lease
// before its request left (503 lease-lost).

// recState is the record's state in the model; "" is no record.
type recState string

const (
	recNone       recState = ""
	recInProgress recState = "in_progress"
	recCompleted  recState = "completed"
	recUnknown    recState = "unknown"
	recReleased   recState = "released"
)

// keyState is the model's state of one key.
type keyState struct {
	rec recState
	// body is the request body the record was reserved with (its
	// fingerprint); "" without a record.
	body string
	// holder is the attempt that reserved the record last.
	holder int
	// applied is the execution that applied the key, and appliedBy its
	// attempt; "" while nothing was applied.
	applied   string
	appliedBy int
}

func (s keyState) String() string {
	out := string(s.rec)
	if out == "" {
		out = "none"
	}
	if s.rec != recNone {
		out += fmt.Sprintf(" body=%s holder=%d", s.body, s.holder)
	}
	if s.applied != "" {
		out += fmt.Sprintf(" applied=%s by %d", s.applied, s.appliedBy)
	}
	return out
}

// opKind is what a model operation does.
type opKind int

const (
	opReserve      opKind = iota // an attempt that reserved (its answer proves it)
	opMaybeReserve               // an attempt that may have reserved (no answer, 503)
	opFinish                     // the end of an attempt that reserved
	opRead                       // an attempt answered from the record
	opExecute                    // an execution by the upstream
)

// modelInput is a model operation's input: everything is known at the
// call except what the history tells in modelOutput.
type modelInput struct {
	kind    opKind
	attempt int
	body    string
}

// modelOutput is what the operation observed.
type modelOutput struct {
	outcome Outcome
	// exec is the execution id in the answer, or of the execution.
	exec string
	// void reports an execution that had no effect.
	void bool
}

// step applies one operation to one state and returns every state it may
// lead to (none: the operation is impossible there).
func step(s keyState, in modelInput, out modelOutput) []keyState {
	reserve := func() (keyState, bool) {
		if s.rec != recNone && s.rec != recReleased {
			return s, false
		}
		if s.rec == recReleased && s.body != in.body {
			return s, false // a released record keeps its fingerprint
		}
		n := s
		n.rec, n.body, n.holder = recInProgress, in.body, in.attempt
		return n, true
	}
	switch in.kind {
	case opReserve:
		if n, ok := reserve(); ok {
			return []keyState{n}
		}
		return nil
	case opMaybeReserve:
		if n, ok := reserve(); ok {
			return []keyState{s, n}
		}
		return []keyState{s}
	case opExecute:
		if s.rec != recInProgress || (in.attempt != 0 && s.holder != in.attempt) || s.applied != "" {
			return nil
		}
		if out.void {
			return []keyState{s}
		}
		n := s
		n.applied, n.appliedBy = out.exec, in.attempt
		if in.attempt == 0 {
			n.appliedBy = s.holder
		}
		return []keyState{n}
	case opFinish:
		held := s.holder == in.attempt && (s.rec == recInProgress || s.rec == recUnknown)
		switch out.outcome {
		case OutcomeExecuted:
			// The upstream's answer to this attempt; its completion may
			// have failed (the store was away), leaving the record to
			// the lease's end and the reconciler.
			if s.applied != out.exec || s.appliedBy != in.attempt {
				return nil
			}
			if held {
				n := s
				n.rec = recCompleted
				return []keyState{s, n}
			}
			return []keyState{s}
		case OutcomeFailed:
			// A void execution (checked on its own operation) released
			// the key, or the release failed.
			if held && s.applied == "" {
				n := s
				n.rec = recReleased
				return []keyState{s, n}
			}
			if s.applied != "" && s.appliedBy == in.attempt {
				return nil
			}
			return []keyState{s}
		case OutcomeGateway:
			// 502 never sent releases; 502 broken off and 504 mark the
			// outcome unknown.
			if held && s.rec == recInProgress {
				u, r := s, s
				u.rec, r.rec = recUnknown, recReleased
				if s.applied == "" {
					return []keyState{s, u, r}
				}
				return []keyState{s, u}
			}
			return []keyState{s}
		case OutcomeLeaseLost:
			// 503 lease-lost: the attempt gave up its lease. Its request
			// never left: the record is dropped (idem.Reject) while it is
			// still the attempt's; or it may have left: the outcome is
			// marked unknown.
			if held && s.rec == recInProgress {
				u := s
				u.rec = recUnknown
				if s.applied == "" {
					return []keyState{s, u, {}}
				}
				return []keyState{s, u}
			}
			return []keyState{s}
		}
		return []keyState{s}
	case opRead:
		same := s.rec != recNone && s.body == in.body
		switch out.outcome {
		case OutcomeReplayed:
			if same && s.rec == recCompleted && s.applied == out.exec {
				return []keyState{s}
			}
		case OutcomeInUse:
			if same && s.rec == recInProgress {
				return []keyState{s}
			}
		case OutcomeUnknown:
			if same && s.rec == recUnknown {
				return []keyState{s}
			}
		case OutcomeReused:
			if s.rec != recNone && s.body != in.body {
				return []keyState{s}
			}
		}
		return nil
	}
	return nil
}

// closure returns the states reachable from s by the moves no client sees.
func closure(s keyState) []keyState {
	out := []keyState{s}
	for i := 0; i < len(out); i++ {
		c := out[i]
		var next []keyState
		switch c.rec {
		case recInProgress:
			u := c
			u.rec = recUnknown // the lease expired
			next = append(next, u)
			if c.applied != "" && c.appliedBy == c.holder {
				d := c
				d.rec = recCompleted // the applying attempt completed it
				next = append(next, d)
			}
			if c.applied == "" {
				r := c
				r.rec = recReleased // a void execution or a request never sent
				next = append(next, r)
			}
		case recUnknown:
			d := c
			if c.applied != "" {
				d.rec = recCompleted // a lookup found it applied, or a late completion
			} else {
				d.rec = recReleased // a lookup found nothing applied
			}
			next = append(next, d)
		}
		for _, n := range next {
			if !containsState(out, n) {
				out = append(out, n)
			}
		}
	}
	return out
}

func containsState(states []keyState, s keyState) bool {
	for _, t := range states {
		if t == s {
			return true
		}
	}
	return false
}

// keyModel is the porcupine model of one key.
var keyModel = (&porcupine.NondeterministicModel{
	Init: func() []any { return toAny(closure(keyState{})) },
	Step: func(state, input, output any) []any {
		var next []keyState
		for _, n := range step(state.(keyState), input.(modelInput), output.(modelOutput)) {
			for _, c := range closure(n) {
				if !containsState(next, c) {
					next = append(next, c)
				}
			}
		}
		return toAny(next)
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(modelInput), output.(modelOutput)
		switch in.kind {
		case opReserve:
			return fmt.Sprintf("reserve(attempt %d, body %s)", in.attempt, in.body)
		case opMaybeReserve:
			return fmt.Sprintf("reserve?(attempt %d, body %s) -> %s", in.attempt, in.body, out.outcome)
		case opExecute:
			v := ""
			if out.void {
				v = " void"
			}
			return fmt.Sprintf("execute(attempt %d, body %s) -> %s%s", in.attempt, in.body, out.exec, v)
		case opFinish:
			return fmt.Sprintf("finish(attempt %d) -> %s %s", in.attempt, out.outcome, out.exec)
		default:
			return fmt.Sprintf("request(attempt %d, body %s) -> %s %s", in.attempt, in.body, out.outcome, out.exec)
		}
	},
	DescribeState: func(state any) string { return state.(keyState).String() },
}).ToModel()

func toAny(states []keyState) []any {
	out := make([]any, len(states))
	for i, s := range states {
		out[i] = s
	}
	return out
}

// linearizeTimeout bounds porcupine's search on one key. A key's history
// is a few dozen operations; a search that runs out counts as a pass (the
// direct checks still run).
const linearizeTimeout = 10 * time.Second

// operations turns one key's history into porcupine operations, with times
// in nanoseconds since begin. An attempt without an answer, and an
// execution still running, may take effect until the end of the history.
func operations(kh *keyHistory, begin time.Time) []porcupine.Operation {
	at := func(t time.Time) int64 { return t.Sub(begin).Nanoseconds() }
	const never = math.MaxInt64 / 2
	var ops []porcupine.Operation
	clients := make(map[int]int) // worker -> porcupine client id
	client := func(worker int) int {
		if id, ok := clients[worker]; ok {
			return id
		}
		clients[worker] = len(clients)
		return clients[worker]
	}
	for _, a := range kh.attempts {
		ret := int64(never)
		if a.answered() {
			ret = at(a.Return)
		}
		in := modelInput{attempt: a.ID, body: a.Body}
		out := modelOutput{outcome: a.Outcome, exec: a.Exec}
		add := func(kind opKind) {
			in.kind = kind
			ops = append(ops, porcupine.Operation{ClientId: client(a.Worker), Input: in, Call: at(a.Call), Output: out, Return: ret})
		}
		switch a.Outcome {
		case OutcomeExecuted, OutcomeFailed, OutcomeGateway, OutcomeLeaseLost:
			add(opReserve)
			add(opFinish)
		case OutcomeReplayed, OutcomeInUse, OutcomeUnknown, OutcomeReused:
			add(opRead)
		case OutcomeNone, OutcomeUnavailable:
			add(opMaybeReserve)
		}
	}
	upstream := -1 // every execution on one line of the visualization
	for _, e := range kh.executions {
		if upstream < 0 {
			upstream = client(-1)
		}
		ret := int64(never)
		if !e.End.IsZero() {
			ret = at(e.End)
		}
		ops = append(ops, porcupine.Operation{
			ClientId: upstream,
			Input:    modelInput{kind: opExecute, attempt: e.Attempt, body: e.Body},
			Call:     at(e.Start),
			Output:   modelOutput{exec: e.ID, void: e.Void()},
			Return:   ret,
		})
	}
	return ops
}

// linearize checks one key's history against the model. On a failure it
// writes porcupine's visualization into dir (when set) and returns the
// anomaly.
func linearize(kh *keyHistory, begin time.Time, dir string) (Anomaly, bool) {
	ops := operations(kh, begin)
	res, info := porcupine.CheckOperationsVerbose(keyModel, ops, linearizeTimeout)
	if res != porcupine.Illegal {
		return Anomaly{}, true
	}
	a := Anomaly{Kind: KindNotLinearizable, Detail: fmt.Sprintf("no order of its %d operations is a history the contract allows", len(ops))}
	if dir != "" {
		path := filepath.Join(dir, "linearizability-"+fileSafe(kh.key)+".html")
		if err := os.MkdirAll(dir, 0o755); err == nil {
			if err := porcupine.VisualizePath(keyModel, info, path); err == nil {
				a.Visualization = path
			}
		}
	}
	return a, false
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

func fileSafe(s string) string {
	return strings.Trim(unsafeChars.ReplaceAllString(s, "_"), "_")
}
