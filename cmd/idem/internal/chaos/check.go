package chaos

import (
	"fmt"
	"sort"
	"strings"
)

// Kinds of anomaly the checker reports.
const (
	// KindDoubleExecution: a key executed again after an execution that
	// was not proven void, or while an earlier one still ran.
	KindDoubleExecution = "double-execution"
	// KindWrongAnswer: a 2xx (or the upstream's 5xx) whose execution id is
	// not this key's, not the attempt's own, or void.
	KindWrongAnswer = "wrong-answer"
	// KindWrongReplay: a replay that is not the original answer.
	KindWrongReplay = "wrong-replay"
	// KindLostAck: a client was given a 2xx, and the record that should
	// replay it is gone or holds something else.
	KindLostAck = "lost-ack"
	// KindLostRecord: the upstream applied the key and the store has no
	// record of it.
	KindLostRecord = "lost-record"
	// KindUnsettled: a record still unknown (or in progress) once the
	// reconciler has had its time.
	KindUnsettled = "unsettled"
	// KindUnexpectedAnswer: an answer outside the contract.
	KindUnexpectedAnswer = "unexpected-answer"
	// KindNotLinearizable: the key's history has no order that the model
	// of the contract accepts (checked with porcupine).
	KindNotLinearizable = "not-linearizable"
)

// Anomaly is one violation of the contract the checker found.
type Anomaly struct {
	Kind   string
	Key    string
	Detail string
	// History is the key's history, one event a line.
	History string
	// Visualization is the path of porcupine's HTML page of the key's
	// history, for KindNotLinearizable when the checker wrote one.
	Visualization string
}

func (a Anomaly) String() string {
	s := fmt.Sprintf("%s on key %s: %s", a.Kind, a.Key, a.Detail)
	if a.Visualization != "" {
		s += "\n  visualization: " + a.Visualization
	}
	return s
}

// CheckConfig says what the run promised.
type CheckConfig struct {
	// Settled reports that the reconciler could answer every lookup and had
	// its time: no record may be left unknown or in progress.
	Settled bool
	// VisualizeDir, when set, receives porcupine's HTML visualization of
	// every key whose history is not linearizable.
	VisualizeDir string
}

// Check runs every check over the history and returns the anomalies, by
// key and kind. The history must be complete: the campaign is over and the
// final records are read.
func Check(h *History, cfg CheckConfig) []Anomaly {
	var out []Anomaly
	keys := h.byKey()
	names := make([]string, 0, len(keys))
	for k := range keys {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		kh := keys[k]
		found := checkKey(kh, cfg)
		if a, ok := linearize(kh, h.Begin, cfg.VisualizeDir); !ok {
			found = append(found, a)
		}
		for i := range found {
			found[i].Key, found[i].History = k, kh.String()
		}
		out = append(out, found...)
	}
	return out
}

// checkKey runs the direct checks on one key.
func checkKey(kh *keyHistory, cfg CheckConfig) []Anomaly {
	var out []Anomaly
	add := func(kind, format string, args ...any) {
		out = append(out, Anomaly{Kind: kind, Detail: fmt.Sprintf(format, args...)})
	}

	// At most one execution, except after one proven void that had ended.
	execs := make(map[string]*Execution, len(kh.executions))
	var applied *Execution // the key's one execution: the first that may have had an effect
	for i, e := range kh.executions {
		execs[e.ID] = e
		for _, p := range kh.executions[:i] {
			switch {
			case !p.Void():
				add(KindDoubleExecution, "%s after %s, which was not void%s", e, p, staleHint(kh, p, e))
			case p.End.After(e.Start):
				add(KindDoubleExecution, "%s began while %s still ran", e, p)
			default:
				continue
			}
			break
		}
		if applied == nil && !e.Void() {
			applied = e
		}
	}

	// Every answer that carries an execution id names the right one, and
	// every replay is the original answer.
	var delivered []*Attempt // 2xx answers, in the order they were read
	for _, a := range kh.attempts {
		switch a.Outcome {
		case OutcomeOther:
			add(KindUnexpectedAnswer, "%s", a)
			continue
		case OutcomeExecuted, OutcomeReplayed, OutcomeFailed:
		default:
			continue
		}
		e := execs[a.Exec]
		switch {
		case e == nil:
			add(KindWrongAnswer, "%s carries an execution id that is not one of this key's", a)
		case a.Outcome == OutcomeFailed && !e.Void():
			add(KindWrongAnswer, "%s, a release, carries %s", a, e)
		case a.Outcome == OutcomeFailed:
		case e.Void():
			add(KindWrongAnswer, "%s carries %s, which was void", a, e)
		case a.Outcome == OutcomeExecuted && e.Attempt != 0 && e.Attempt != a.ID:
			add(KindWrongAnswer, "%s is not replayed but carries %s", a, e)
		case a.Outcome == OutcomeReplayed && applied != nil && e != applied:
			add(KindWrongReplay, "%s replays %s; the key's execution is %s", a, e.ID, applied.ID)
		}
		if a.Outcome != OutcomeFailed {
			delivered = append(delivered, a)
		}
	}
	sort.SliceStable(delivered, func(i, j int) bool { return delivered[i].Return.Before(delivered[j].Return) })
	for i, a := range delivered {
		if a.Outcome != OutcomeReplayed {
			continue
		}
		for _, p := range delivered[:i] {
			if p.Exec != a.Exec && p.Return.Before(a.Return) {
				add(KindWrongReplay, "%s differs from the earlier answer of %s", a, p)
				break
			}
		}
	}

	// What a client was told, and what the upstream applied, the store
	// keeps.
	if kh.hasFinal {
		f := kh.final
		acked := make(map[string]bool)
		for _, a := range delivered {
			acked[a.Exec] = true
		}
		switch {
		case len(acked) > 0 && (f.State != "completed" || !acked[f.Exec]):
			add(KindLostAck, "clients were given %s; the record is %s", strings.Join(sortedKeys(acked), ", "), describeFinal(f))
		case applied != nil && f.State == "":
			add(KindLostRecord, "%s applied the key; the store has no record of it", applied)
		}
		if cfg.Settled && (f.State == "unknown" || f.State == "in_progress") {
			add(KindUnsettled, "the record is still %s after the reconciler's time", f.State)
		}
		if f.State == "completed" && applied != nil && f.Exec != applied.ID && f.Exec != "" && len(acked) == 0 {
			add(KindWrongReplay, "the record would replay %s; the key's execution is %s", f.Exec, applied.ID)
		}
	}
	return out
}

// staleHint explains a double execution of p and e in which an attempt
// sent before a lookup answered 404 reached the upstream only after it:
// the key was released while that attempt could still act (the pause
// defect).
func staleHint(kh *keyHistory, p, e *Execution) string {
	for _, l := range kh.lookups {
		if l.Status != 404 {
			continue
		}
		for _, x := range []*Execution{p, e} {
			for _, a := range kh.attempts {
				if a.ID == x.Attempt && a.Call.Before(l.At) && l.At.Before(x.Start) {
					return fmt.Sprintf(" (the %s released the key while attempt %d, sent at %s, had not reached the upstream; it did at %s: a stale attempt acted)",
						l, a.ID, stamp(a.Call), stamp(x.Start))
				}
			}
		}
	}
	return ""
}

func describeFinal(f Final) string {
	if f.State == "" {
		return "gone"
	}
	if f.Exec != "" {
		return fmt.Sprintf("%s with %s", f.State, f.Exec)
	}
	return f.State
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
