package chaos

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// builder makes hand-made histories of one key, "k", with times in
// milliseconds from the start.
type builder struct {
	h *History
}

func newBuilder() *builder {
	return &builder{h: &History{Begin: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC), Finals: make(map[string]Final)}}
}

func (b *builder) at(ms int) time.Time { return b.h.Begin.Add(time.Duration(ms) * time.Millisecond) }

// attempt adds an attempt of worker w; ret < 0 is no answer.
func (b *builder) attempt(id, w int, body string, call, ret int, out Outcome, exec string) *builder {
	a := &Attempt{ID: id, Op: id, Worker: w, Key: "k", Body: body, Call: b.at(call), Outcome: out, Exec: exec}
	if ret >= 0 {
		a.Return = b.at(ret)
	}
	switch out {
	case OutcomeExecuted, OutcomeReplayed:
		a.Status, a.Replayed = 201, out == OutcomeReplayed
	case OutcomeFailed:
		a.Status = 500
	case OutcomeInUse, OutcomeUnknown:
		a.Status = 409
	case OutcomeReused:
		a.Status = 422
	}
	b.h.Attempts = append(b.h.Attempts, a)
	return b
}

// exec adds an execution by attempt; end < 0 is still running.
func (b *builder) exec(id string, attempt int, body string, start, end, status int) *builder {
	e := &Execution{ID: id, Key: "k", Body: body, Attempt: attempt, Start: b.at(start), Status: status}
	if end >= 0 {
		e.End = b.at(end)
	}
	b.h.Executions = append(b.h.Executions, e)
	return b
}

func (b *builder) lookup(at, status int, exec string) *builder {
	b.h.Lookups = append(b.h.Lookups, &Lookup{Key: "k", At: b.at(at), Status: status, Exec: exec})
	return b
}

func (b *builder) final(state, exec string) *builder {
	b.h.Finals["k"] = Final{State: state, Exec: exec}
	return b
}

func kinds(as []Anomaly) []string {
	var out []string
	for _, a := range as {
		if !slices.Contains(out, a.Kind) {
			out = append(out, a.Kind)
		}
	}
	slices.Sort(out)
	return out
}

// TestCheckAcceptsContract runs the checker over histories the contract
// allows, with faults: none may be reported.
func TestCheckAcceptsContract(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		b    *builder
	}{
		{"one execution, a duplicate in use, a replay", newBuilder().
			attempt(1, 1, "a", 0, 100, OutcomeExecuted, "x1").
			exec("x1", 1, "a", 10, 90, 201).
			attempt(2, 2, "a", 5, 20, OutcomeInUse, "").
			attempt(3, 2, "a", 150, 160, OutcomeReplayed, "x1").
			final("completed", "x1")},
		{"a void execution, then a retry runs", newBuilder().
			attempt(1, 1, "a", 0, 100, OutcomeFailed, "x1").
			exec("x1", 1, "a", 10, 90, 500).
			attempt(2, 1, "a", 120, 200, OutcomeExecuted, "x2").
			exec("x2", 2, "a", 130, 190, 201).
			attempt(3, 2, "a", 250, 260, OutcomeReplayed, "x2").
			final("completed", "x2")},
		{"a killed proxy after the upstream applied: unknown, then the lookup completes it", newBuilder().
			attempt(1, 1, "a", 0, -1, OutcomeNone, "").
			exec("x1", 1, "a", 10, 90, 201).
			attempt(2, 1, "a", 2000, 2010, OutcomeUnknown, "").
			lookup(2500, 201, "x1").
			attempt(3, 1, "a", 3000, 3010, OutcomeReplayed, "x1").
			final("completed", "x1")},
		{"a killed proxy before the upstream: the lookup releases, the retry runs once", newBuilder().
			attempt(1, 1, "a", 0, -1, OutcomeNone, "").
			attempt(2, 1, "a", 1000, 1010, OutcomeInUse, "").
			attempt(3, 1, "a", 2000, 2010, OutcomeUnknown, "").
			lookup(2500, 404, "").
			attempt(4, 1, "a", 3000, 3100, OutcomeExecuted, "x1").
			exec("x1", 4, "a", 3010, 3090, 201).
			final("completed", "x1")},
		{"the key reused with another body", newBuilder().
			attempt(1, 1, "a", 0, 100, OutcomeExecuted, "x1").
			exec("x1", 1, "a", 10, 90, 201).
			attempt(2, 2, "b", 200, 210, OutcomeReused, "").
			final("completed", "x1")},
		{"the store away, then back", newBuilder().
			attempt(1, 1, "a", 0, 10, OutcomeUnavailable, "").
			attempt(2, 1, "a", 2000, 2010, OutcomeUnknown, ""). // the 503 hid a reservation
			lookup(2100, 404, "").
			attempt(3, 1, "a", 2200, 2300, OutcomeExecuted, "x1").
			exec("x1", 3, "a", 2210, 2290, 201).
			final("completed", "x1")},
		{"a gateway timeout, the upstream answers late, the lookup completes it", newBuilder().
			attempt(1, 1, "a", 0, 100, OutcomeGateway, "").
			exec("x1", 1, "a", 10, 300, 201).
			attempt(2, 1, "a", 150, 160, OutcomeUnknown, "").
			lookup(200, 503, "").
			lookup(400, 201, "x1").
			attempt(3, 1, "a", 500, 510, OutcomeReplayed, "x1").
			final("completed", "x1")},
		{"a paused proxy gives its lease up unsent, the retry runs once", newBuilder().
			attempt(1, 1, "a", 0, 9000, OutcomeLeaseLost, "").
			attempt(2, 1, "a", 9100, 9200, OutcomeExecuted, "x1").
			exec("x1", 2, "a", 9110, 9190, 201).
			attempt(3, 1, "a", 9300, 9310, OutcomeReplayed, "x1").
			final("completed", "x1")},
		{"a lease given up while the request was on its way: unknown, then looked up", newBuilder().
			attempt(1, 1, "a", 0, 500, OutcomeLeaseLost, "").
			exec("x1", 1, "a", 100, 400, 201).
			attempt(2, 1, "a", 600, 610, OutcomeUnknown, "").
			lookup(700, 201, "x1").
			attempt(3, 1, "a", 800, 810, OutcomeReplayed, "x1").
			final("completed", "x1")},
		{"two bodies race: one reserves, the other is told reused", newBuilder().
			attempt(1, 1, "a", 0, 100, OutcomeExecuted, "x1").
			attempt(2, 2, "b", 0, 20, OutcomeReused, "").
			exec("x1", 1, "a", 10, 90, 201).
			final("completed", "x1")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := Check(tt.b.h, CheckConfig{Settled: true}); len(got) != 0 {
				t.Fatalf("anomalies in a history the contract allows:\n%v\n%s", got, got[0].History)
			}
		})
	}
}

// TestCheckFindsAnomalies runs the checker over histories that break the
// contract: each must be reported, with the kinds listed.
func TestCheckFindsAnomalies(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name  string
		b     *builder
		kinds []string
	}{
		{"a second execution after a completed one", newBuilder().
			attempt(1, 1, "a", 0, 100, OutcomeExecuted, "x1").
			exec("x1", 1, "a", 10, 90, 201).
			attempt(2, 2, "a", 200, 300, OutcomeExecuted, "x2").
			exec("x2", 2, "a", 210, 290, 201).
			final("completed", "x2"),
			[]string{KindDoubleExecution, KindNotLinearizable}},
		{"the pause defect: a stale attempt acts after a 404 lookup released its key", newBuilder().
			attempt(1, 1, "a", 0, -1, OutcomeNone, ""). // its proxy was stopped after the reservation
			attempt(2, 1, "a", 1000, 1010, OutcomeInUse, "").
			attempt(3, 1, "a", 3000, 3010, OutcomeUnknown, "").
			lookup(3500, 404, "").
			attempt(4, 1, "a", 4000, 4100, OutcomeExecuted, "x1").
			exec("x1", 4, "a", 4010, 4090, 201).
			exec("x2", 1, "a", 6000, 6100, 201). // the stopped proxy resumed
			attempt(5, 2, "a", 7000, 7010, OutcomeReplayed, "x1").
			final("completed", "x1"),
			[]string{KindDoubleExecution, KindNotLinearizable}},
		{"a lease given up unsent, yet the stale attempt executes after the retry", newBuilder().
			attempt(1, 1, "a", 0, 9000, OutcomeLeaseLost, "").
			attempt(2, 1, "a", 9100, 9200, OutcomeExecuted, "x1").
			exec("x1", 2, "a", 9110, 9190, 201).
			exec("x2", 1, "a", 9500, 9600, 201).
			final("completed", "x1"),
			[]string{KindDoubleExecution, KindNotLinearizable}},
		// The model takes an execution at one point of its interval, so
		// only the direct check sees the overlap.
		{"two executions at once, one of them void", newBuilder().
			attempt(1, 1, "a", 0, 100, OutcomeFailed, "x1").
			exec("x1", 1, "a", 10, 90, 500).
			attempt(2, 2, "a", 40, 200, OutcomeExecuted, "x2").
			exec("x2", 2, "a", 50, 150, 201).
			final("completed", "x2"),
			[]string{KindDoubleExecution}},
		{"a replay that is not the original answer", newBuilder().
			attempt(1, 1, "a", 0, 100, OutcomeExecuted, "x1").
			exec("x1", 1, "a", 10, 90, 201).
			attempt(2, 2, "a", 200, 210, OutcomeReplayed, "x9").
			final("completed", "x1"),
			[]string{KindNotLinearizable, KindWrongAnswer, KindWrongReplay}},
		{"a replay of the second of two executions", newBuilder().
			attempt(1, 1, "a", 0, 100, OutcomeExecuted, "x1").
			exec("x1", 1, "a", 10, 90, 201).
			attempt(2, 2, "a", 50, 190, OutcomeExecuted, "x2").
			exec("x2", 2, "a", 60, 180, 201).
			attempt(3, 3, "a", 300, 310, OutcomeReplayed, "x2").
			final("completed", "x2"),
			[]string{KindDoubleExecution, KindNotLinearizable, KindWrongReplay}},
		{"another attempt's answer given as fresh", newBuilder().
			attempt(1, 1, "a", 0, -1, OutcomeNone, "").
			exec("x1", 1, "a", 10, 90, 201).
			attempt(2, 2, "a", 20, 200, OutcomeExecuted, "x1").
			final("completed", "x1"),
			[]string{KindNotLinearizable, KindWrongAnswer}},
		{"key-in-use after a completion was replayed", newBuilder().
			attempt(1, 1, "a", 0, 100, OutcomeExecuted, "x1").
			exec("x1", 1, "a", 10, 90, 201).
			attempt(2, 2, "a", 200, 210, OutcomeReplayed, "x1").
			attempt(3, 2, "a", 300, 310, OutcomeInUse, "").
			final("completed", "x1"),
			[]string{KindNotLinearizable}},
		{"key-reused before the other body reserved", newBuilder().
			attempt(1, 1, "a", 0, 10, OutcomeReused, "").
			attempt(2, 2, "b", 100, 200, OutcomeExecuted, "x1").
			exec("x1", 2, "b", 110, 190, 201).
			final("completed", "x1"),
			[]string{KindNotLinearizable}},
		{"an execution with the body a released record does not hold", newBuilder().
			attempt(1, 1, "a", 0, 100, OutcomeFailed, "x1").
			exec("x1", 1, "a", 10, 90, 500).
			attempt(2, 2, "b", 200, 300, OutcomeExecuted, "x2").
			exec("x2", 2, "b", 210, 290, 201).
			final("completed", "x2"),
			[]string{KindNotLinearizable}},
		{"an acknowledged completion lost", newBuilder().
			attempt(1, 1, "a", 0, 100, OutcomeExecuted, "x1").
			exec("x1", 1, "a", 10, 90, 201).
			final("", ""),
			[]string{KindLostAck}},
		{"an applied key without a record", newBuilder().
			attempt(1, 1, "a", 0, -1, OutcomeNone, "").
			exec("x1", 1, "a", 10, 90, 201).
			final("", ""),
			[]string{KindLostRecord}},
		{"an unknown record left unsettled", newBuilder().
			attempt(1, 1, "a", 0, -1, OutcomeNone, "").
			exec("x1", 1, "a", 10, 90, 201).
			final("unknown", ""),
			[]string{KindUnsettled}},
		{"an answer outside the contract", newBuilder().
			attempt(1, 1, "a", 0, 100, OutcomeOther, "").
			final("", ""),
			[]string{KindUnexpectedAnswer}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := Check(tt.b.h, CheckConfig{Settled: true})
			if k := kinds(got); !slices.Equal(k, tt.kinds) {
				t.Fatalf("kinds %v, want %v:\n%v", k, tt.kinds, got)
			}
			for _, a := range got {
				if a.Key != "k" || a.Detail == "" || !strings.Contains(a.History, "key k:") {
					t.Fatalf("anomaly without its key, detail or history: %+v", a)
				}
			}
		})
	}
}

// TestCheckNamesThePauseDefect: the report of a stale attempt's execution
// says what happened, not only that a key ran twice.
func TestCheckNamesThePauseDefect(t *testing.T) {
	t.Parallel()
	b := newBuilder().
		attempt(1, 1, "a", 0, -1, OutcomeNone, "").
		lookup(3500, 404, "").
		attempt(4, 1, "a", 4000, 4100, OutcomeExecuted, "x1").
		exec("x1", 4, "a", 4010, 4090, 201).
		exec("x2", 1, "a", 6000, 6100, 201).
		final("completed", "x1")
	for _, a := range Check(b.h, CheckConfig{Settled: true}) {
		if a.Kind == KindDoubleExecution {
			if !strings.Contains(a.Detail, "a stale attempt acted") {
				t.Fatalf("the double execution does not name the stale attempt: %s", a.Detail)
			}
			return
		}
	}
	t.Fatal("no double execution reported")
}

// TestCheckWritesVisualization: a history that is not linearizable leaves
// porcupine's HTML page in the directory given.
func TestCheckWritesVisualization(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b := newBuilder().
		attempt(1, 1, "a", 0, 100, OutcomeExecuted, "x1").
		exec("x1", 1, "a", 10, 90, 201).
		attempt(2, 2, "a", 200, 210, OutcomeReplayed, "x1").
		attempt(3, 2, "a", 300, 310, OutcomeInUse, "")
	got := Check(b.h, CheckConfig{VisualizeDir: dir})
	if len(got) != 1 || got[0].Visualization == "" {
		t.Fatalf("want one not-linearizable anomaly with a visualization: %v", got)
	}
	page, err := os.ReadFile(got[0].Visualization)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(page), "<html") {
		t.Fatalf("the visualization is not an HTML page: %.200s", page)
	}
}
