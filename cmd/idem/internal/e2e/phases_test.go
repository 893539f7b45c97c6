package e2e

import (
	"bytes"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
)

// TestPhasesResumeAfterKills runs an operation of three atomic phases on
// servers that kill themselves (SIGKILL) at chosen points, each retry on a
// fresh process once the lease has run out. Every kill point of every phase
// is covered by one of the two sequences: after the phase's external call
// but before its commit, and after its commit.
func TestPhasesResumeAfterKills(t *testing.T) {
	t.Parallel()
	sequences := []struct {
		name  string
		kills []string
	}{
		{"call1-commit2-commit3", []string{"phase1/called", "phase2/committed", "phase3/committed"}},
		{"commit1-call2-call3", []string{"phase1/committed", "phase2/called", "phase3/called"}},
	}
	for _, seq := range sequences {
		t.Run(seq.name, func(t *testing.T) {
			t.Parallel()
			testPhaseKills(t, seq.kills)
		})
	}
}

func testPhaseKills(t *testing.T, kills []string) {
	e := newEnv(t)
	writes := e.table("phase_writes")
	e.exec("CREATE TABLE " + writes + " (id bigserial PRIMARY KEY, op_key text NOT NULL, phase text NOT NULL, pid integer NOT NULL)")
	down := newDownstream(t)
	key := "order-" + randomHex(4)
	const body = `{"items":[{"sku":"A1","qty":2}]}`
	url := func(p *proc) string { return p.URL + "/v1/orders" }

	recoveryPoint := ""
	for i, kill := range kills {
		p := e.startChild("phases-server-kill-"+strings.ReplaceAll(kill, "/", "-"), "phases",
			map[string]string{childDown: down.URL, childKillAt: kill})
		var got answer
		if i == 0 {
			got = post(t.Context(), url(p), key, body)
		} else {
			got = retryWhileInUse(t, url(p), key, body, 20*time.Second)
		}
		if got.err == nil {
			t.Fatalf("the server that was to die at %s answered: %v", kill, got)
		}
		p.wait(t, 30*time.Second)
		if !p.killedBySIGKILL() || p.waitLine(regexp.MustCompile(`msg="killing myself" at=`+regexp.QuoteMeta(kill)+`\b`), time.Second) == nil {
			t.Fatalf("the server did not kill itself at %s: %v\n%s", kill, p.cmd.ProcessState, p.output())
		}
		// The phases before the kill point committed in this run or an
		// earlier one; the phase killed after its call rolled back.
		phase, where, _ := strings.Cut(kill, "/")
		if i := slices.Index(phaseNames, phase); where == "committed" {
			recoveryPoint = phase
		} else if i > 0 {
			recoveryPoint = phaseNames[i-1]
		} else {
			recoveryPoint = ""
		}
		rec := e.record()
		if rec.RecoveryPoint != recoveryPoint || rec.Attempts != i+1 {
			t.Fatalf("after the kill at %s: recovery point %q after %d attempts, want %q after %d",
				kill, rec.RecoveryPoint, rec.Attempts, recoveryPoint, i+1)
		}
		// The local writes of the committed phases are there, once each,
		// and nothing else.
		committed := phaseNames[:slices.Index(phaseNames, recoveryPoint)+1]
		if n := e.count("SELECT count(*) FROM " + writes); n != len(committed) {
			t.Fatalf("after the kill at %s: %d local writes, want %d (%v)", kill, n, len(committed), committed)
		}
	}

	p := e.startChild("phases-server", "phases", map[string]string{childDown: down.URL})
	got := retryWhileInUse(t, url(p), key, body, 20*time.Second)
	if got.err != nil || got.status != http.StatusCreated || got.replayed != "" {
		t.Fatalf("the last retry: %v, want 201 from the resumed operation", got)
	}
	if want := fmt.Sprintf(`"resumed_from":%q`, recoveryPoint); !bytes.Contains(got.body, []byte(want)) {
		t.Fatalf("the last retry answered %s, want it resumed after %q", got.body, recoveryPoint)
	}
	replay := post(t.Context(), url(p), key, body)
	if replay.status != http.StatusCreated || replay.replayed != "true" || !bytes.Equal(replay.body, got.body) {
		t.Fatalf("replay: %v, want the replay of %q", replay, got.body)
	}
	rec := e.record()
	if rec.State != idemstore.StateCompleted || rec.RecoveryPoint != phaseNames[len(phaseNames)-1] || rec.Attempts != len(kills)+1 {
		t.Fatalf("record: %s at %q after %d attempts, want completed at %q after %d",
			rec.State, rec.RecoveryPoint, rec.Attempts, phaseNames[len(phaseNames)-1], len(kills)+1)
	}

	down.mu.Lock()
	defer down.mu.Unlock()
	for _, phase := range phaseNames {
		// Each phase's local write exists exactly once.
		if n := e.count("SELECT count(*) FROM "+writes+" WHERE op_key = $1 AND phase = $2", key, phase); n != 1 {
			t.Errorf("%s: %d local writes, want 1", phase, n)
		}
		// Each phase's external effect happened exactly once, under the key
		// derived from the client's key and the phase's name. The number of
		// calls may be higher: a process killed after the call and before
		// the commit leaves the phase uncommitted, so the retry runs it
		// again and calls the downstream a second time with the same
		// derived key, which the downstream deduplicates. What must hold is
		// the effect, not the call count; the count is checked only to show
		// the repeated call did happen.
		derived := idem.DeriveKey(rec.Identity, phase)
		if effects := down.effects[phase]; len(effects) != 1 || effects[0] != derived {
			t.Errorf("%s: effects under keys %v, want exactly one under %s", phase, effects, derived)
		}
		wantCalls := 1
		for _, k := range kills {
			if k == phase+"/called" {
				wantCalls++
			}
		}
		if n := down.calls[derived]; n != wantCalls {
			t.Errorf("%s: %d calls to the downstream, want %d", phase, n, wantCalls)
		}
	}
	if len(down.calls) != len(phaseNames) {
		t.Errorf("the downstream saw %d keys, want %d", len(down.calls), len(phaseNames))
	}
}
