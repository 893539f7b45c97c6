package idemredis

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemtest"
)

// TestReplayableMatchesScript checks that replayable accepts the records
// reserve.lua answers as they are stored at now (its DONE match and
// expires_at comparison; a comparison that fails in Lua is for the script
// to report), and no other: any other record goes to the script. An
// expires_at past parseDigits's 18 digits, which Lua reads as a float, is
// for the script too, and so is a value that is not a whole record (the
// script would answer it, and KeyReserve fail to decode it).
func TestReplayableMatchesScript(t *testing.T) {
	t.Parallel()
	client := sharedClient(t)
	lib, err := luaFiles.ReadFile("lua/lib.lua")
	if err != nil {
		t.Fatal(err)
	}
	script := redis.NewScript(string(lib) + `
local expires_at = string.match(ARGV[1], DONE)
local ok, done = pcall(function() return expires_at and tonumber(expires_at) >= tonumber(ARGV[2]) end)
if ok and done then
  return 1
end
return 0`)
	full := codecCases()["full"]
	now, _ := parseInt(full.expiresAt)
	with := func(change func(f *recordFields)) string {
		f := *full
		change(&f)
		return encodeFields(&f)
	}
	cases := map[string]string{
		"completed":           encodeFields(full),
		"in progress":         with(func(f *recordFields) { f.state = "in_progress" }),
		"unknown":             with(func(f *recordFields) { f.state = "unknown" }),
		"released":            with(func(f *recordFields) { f.state = "released" }),
		"not replayable":      with(func(f *recordFields) { f.notReplayable, f.status, f.hasStatus = "1", "", false }),
		"other version":       "1" + encodeFields(full)[1:],
		"uppercase state":     with(func(f *recordFields) { f.leaseExpiredState = "Unknown" }),
		"empty lease state":   with(func(f *recordFields) { f.leaseExpiredState = "" }),
		"letter in lease":     with(func(f *recordFields) { f.lockedUntil = "17641x" }),
		"negative lease":      with(func(f *recordFields) { f.lockedUntil = "-5" }),
		"empty expiry":        with(func(f *recordFields) { f.expiresAt = "" }),
		"minus expiry":        with(func(f *recordFields) { f.expiresAt = "-" }),
		"inner minus expiry":  with(func(f *recordFields) { f.expiresAt = "17-1" }),
		"leading zero expiry": with(func(f *recordFields) { f.expiresAt = "0" + f.expiresAt }),
		"negative expiry":     with(func(f *recordFields) { f.expiresAt = "-" + f.expiresAt }),
		"19 digits expiry":    with(func(f *recordFields) { f.expiresAt = "1" + f.expiresAt + "000" }),
		"no record":           "",
		"cut":                 "2,completed,",
		"head only":           "2,completed,unknown,1764119000000000," + full.expiresAt + ",",
	}
	for name, v := range cases {
		for _, at := range []int64{now - 1, now, now + 1} {
			t.Run(name+"/"+strconv.FormatInt(at-now, 10), func(t *testing.T) {
				lua, err := script.Run(t.Context(), client, nil, v, at).Int()
				if err != nil {
					t.Fatal(err)
				}
				var f recordFields
				got := f.parse(v) == nil && f.replayable(at)
				if !got && (name == "19 digits expiry" || name == "head only") {
					return
				}
				if got != (lua == 1) {
					t.Fatalf("replayable(%q, %d) = %v, reserve.lua's DONE match %v", v, at, got, lua == 1)
				}
			})
		}
	}
}

// commandLog is a redis.Hook that records the names of the commands sent,
// pipelined ones too.
type commandLog struct {
	mu    sync.Mutex
	names []string
}

func (l *commandLog) DialHook(next redis.DialHook) redis.DialHook { return next }

func (l *commandLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		l.add(cmd)
		return next(ctx, cmd)
	}
}

func (l *commandLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			l.add(cmd)
		}
		return next(ctx, cmds)
	}
}

// add logs cmd unless it is a connection's handshake (HELLO, CLIENT) or
// the load of a script or function the server lacked (EVAL after NOSCRIPT,
// FUNCTION LOAD): what is left is one command per round trip of a call.
func (l *commandLog) add(cmd redis.Cmder) {
	switch cmd.Name() {
	case "hello", "client", "eval", "function":
		return
	}
	l.mu.Lock()
	l.names = append(l.names, cmd.Name())
	l.mu.Unlock()
}

// during returns the commands f sent.
func (l *commandLog) during(f func()) []string {
	l.mu.Lock()
	l.names = nil
	l.mu.Unlock()
	f()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.names
}

// replayClient returns a client of its own (one per test: its commands are
// logged) for clients' client.
func replayClient(t *testing.T, like redis.UniversalClient) (redis.UniversalClient, *commandLog) {
	var c redis.UniversalClient
	switch like.(type) {
	case *redis.ClusterClient:
		c = clusterClient(t)
	case *redis.Client:
		c = sharedClient(t)
	default:
		t.Fatalf("client %T", like)
	}
	log := &commandLog{}
	c.AddHook(log)
	return c, log
}

// TestReplayReadsWithGet checks that a record the store completed, or
// found completed, is replayed with one GET, which answers what reserve.lua
// answers; and that a new key, or a key whose retention this store knows
// to be over, is reserved with the script alone, in one round trip.
func TestReplayReadsWithGet(t *testing.T) {
	clients(t, func(t *testing.T, shared redis.UniversalClient) {
		client, log := replayClient(t, shared)
		clock := idemtest.NewClock(time.Now())
		s := newTestStore(t, client, clock.Now)
		ctx := t.Context()
		p := reserveParams("t1", idemstore.StateUnknown)
		if cmds := log.during(func() { mustReserve(t, s, p, true) }); len(cmds) != 1 || cmds[0] == "get" {
			t.Fatalf("a new key sent %v, want one script", cmds)
		}
		complete(t, s, "t1", "paid")
		p.Token = "t2"
		var replay *idemstore.ReserveResult
		if cmds := log.during(func() { replay = mustReserve(t, s, p, false) }); !reflect.DeepEqual(cmds, []string{"get"}) {
			t.Fatalf("a replay of a key the store completed sent %v, want a GET", cmds)
		}
		// Another store (another process) knows nothing of the key: it runs
		// the script, and then reads with a GET too.
		other := New(client, &Config{Prefix: s.prefix, Now: clock.Now})
		var scripted *idemstore.ReserveResult
		if cmds := log.during(func() { scripted = mustReserve(t, other, p, false) }); len(cmds) != 1 || cmds[0] == "get" {
			t.Fatalf("a first replay sent %v, want one script", cmds)
		}
		if !reflect.DeepEqual(replay, scripted) {
			t.Fatalf("the GET answered %+v, the script %+v", replay.Record, scripted.Record)
		}
		if cmds := log.during(func() { mustReserve(t, other, p, false) }); !reflect.DeepEqual(cmds, []string{"get"}) {
			t.Fatalf("a replay of a key the store found completed sent %v, want a GET", cmds)
		}

		// Past its retention: the key is new again, reserved in one round
		// trip.
		clock.Advance(p.TTL + time.Microsecond)
		if cmds := log.during(func() { mustReserve(t, s, p, true) }); len(cmds) != 1 || cmds[0] == "get" {
			t.Fatalf("a key past its retention sent %v, want one script", cmds)
		}
		if r, err := s.KeyGet(ctx, testID); err != nil || r.State != idemstore.StateInProgress || r.Token != "t2" {
			t.Fatalf("KeyGet = %+v, %v; want the new reservation", r, err)
		}
	})
}

// TestReplayStaleGuess checks that a store that last saw a record completed
// answers what reserve.lua answers when the record changed since: purged
// and reserved again by another store, purged, or of the earlier layout.
func TestReplayStaleGuess(t *testing.T) {
	clients(t, func(t *testing.T, shared redis.UniversalClient) {
		client, log := replayClient(t, shared)
		clock := idemtest.NewClock(time.Now())
		s := newTestStore(t, client, clock.Now)
		other := New(client, &Config{Prefix: s.prefix, Now: clock.Now})
		ctx := t.Context()
		completed := func(token string) {
			mustReserve(t, s, reserveParams(token, idemstore.StateUnknown), true)
			complete(t, s, token, "paid")
		}
		purge := func() {
			if _, err := other.KeyPurge(ctx, &idemstore.PurgeParams{Identity: testID, Force: true}); err != nil {
				t.Fatal(err)
			}
		}

		// Purged, then in progress for another store: in use.
		completed("t1")
		purge()
		mustReserve(t, other, reserveParams("t2", idemstore.StateUnknown), true)
		var res *idemstore.ReserveResult
		cmds := log.during(func() { res = mustReserve(t, s, reserveParams("t3", idemstore.StateUnknown), false) })
		if res.Record.State != idemstore.StateInProgress || res.Record.Token != "t2" || len(cmds) != 2 {
			t.Fatalf("reserve of a key in use = %+v after %v; want in progress with t2, a GET and the script", res.Record, cmds)
		}
		if err := other.KeyRelease(ctx, &idemstore.FinishParams{Identity: testID, Token: "t2"}); err != nil {
			t.Fatal(err)
		}
		// (Released: taken over, then completed.)
		mustReserve(t, s, reserveParams("t4", idemstore.StateUnknown), true)
		complete(t, s, "t4", "paid again")

		// Purged: the key is new, and its reservation indexes the lease
		// (the sweeper finds it).
		purge()
		mustReserve(t, s, reserveParams("t5", idemstore.StateUnknown), true)
		clock.Advance(time.Minute)
		swept, err := s.KeySweep(ctx, &idemstore.SweepParams{})
		if err != nil || len(swept) != 1 || swept[0].Identity != testID {
			t.Fatalf("KeySweep = %v, %v; want the reservation made after the purge", identities(swept), err)
		}
		if err := s.KeyResolve(ctx, &idemstore.ResolveParams{Identity: testID, Token: "t5", To: idemstore.StateCompleted,
			Response: &idemstore.Response{Status: 201, Body: []byte("resolved")}}); err != nil {
			t.Fatal(err)
		}
		res = mustReserve(t, s, reserveParams("t6", idemstore.StateUnknown), false)
		if string(res.Record.Response.Body) != "resolved" {
			t.Fatalf("replay after the resolve = %q", res.Record.Response.Body)
		}

		// Replaced by a record of the earlier layout (a hash): read by the
		// script.
		k := s.keysOf(testID)
		if err := client.Del(ctx, k.record).Err(); err != nil {
			t.Fatal(err)
		}
		if err := client.HSet(ctx, k.record, legacyHash(testID, idemstore.StateCompleted, "t7", clock.Now())...).Err(); err != nil {
			t.Fatal(err)
		}
		res = mustReserve(t, s, reserveParams("t8", idemstore.StateUnknown), false)
		if res.Record.Token != "t7" || string(res.Record.Response.Body) != "paid" {
			t.Fatalf("replay of a hash record = %+v", res.Record)
		}
	})
}

// TestReplayKeepsDecoded checks that a replay of a record unchanged since
// the last one answers what that one decoded, and that a record changed
// meanwhile (resealed, or completed again after a purge) is decoded anew;
// a record too long to keep is decoded every time.
func TestReplayKeepsDecoded(t *testing.T) {
	t.Parallel()
	client := sharedClient(t)
	s := newTestStore(t, client, time.Now)
	other := New(client, &Config{Prefix: s.prefix})
	ctx := t.Context()
	mustReserve(t, s, reserveParams("t1", idemstore.StateUnknown), true)
	complete(t, s, "t1", "paid")
	first := mustReserve(t, s, reserveParams("r", idemstore.StateUnknown), false)
	if again := mustReserve(t, s, reserveParams("r", idemstore.StateUnknown), false); again != first {
		t.Fatalf("a replay of an unchanged record decoded it again")
	}
	err := other.KeyReseal(ctx, &idemstore.ResealParams{Identity: testID, Token: "t1",
		Response: &idemstore.Response{Status: 201, Body: []byte("resealed")}})
	if err != nil {
		t.Fatal(err)
	}
	if res := mustReserve(t, s, reserveParams("r", idemstore.StateUnknown), false); string(res.Record.Response.Body) != "resealed" {
		t.Fatalf("a replay after a reseal answered %q", res.Record.Response.Body)
	}
	if _, err := other.KeyPurge(ctx, &idemstore.PurgeParams{Identity: testID}); err != nil {
		t.Fatal(err)
	}
	mustReserve(t, other, reserveParams("t2", idemstore.StateUnknown), true)
	long := strings.Repeat("x", maxKeptReplay)
	if err := other.KeyComplete(ctx, &idemstore.CompleteParams{Identity: testID, Token: "t2",
		Response: &idemstore.Response{Status: 201, Body: []byte(long)}}); err != nil {
		t.Fatal(err)
	}
	first = mustReserve(t, s, reserveParams("r", idemstore.StateUnknown), false)
	again := mustReserve(t, s, reserveParams("r", idemstore.StateUnknown), false)
	if string(first.Record.Response.Body) != long || first.Record.Token != "t2" || !reflect.DeepEqual(again, first) {
		t.Fatalf("replays of the record completed again = %+v, %+v", first.Record, again.Record)
	}
	if again == first {
		t.Fatalf("a record of more than %d bytes was kept decoded", maxKeptReplay)
	}
}

// TestReplayRacesPurge replays a key from many goroutines of one store
// while another store purges it and runs it again. Each completion stores
// a response of its own, numbered by a generation (its body, status and a
// header say which), and the test checks every answer a reservation got:
// a replay is exactly one response that was stored for the key, under the
// token that stored it (never a mix of two, never one whose completion
// failed), and never one of a generation that a purge had removed before
// the reservation began; a record in progress carries no response.
func TestReplayRacesPurge(t *testing.T) {
	clients(t, func(t *testing.T, client redis.UniversalClient) {
		s := newTestStore(t, client, time.Now)
		other := New(client, &Config{Prefix: s.prefix})
		ctx := t.Context()

		// The completions, by generation: each takes the next number
		// once its reservation returned, so a purge that starts after
		// generation g was taken removes g's record and its response for
		// good (a completion after it finds its lease lost).
		type completion struct {
			token  string
			resp   *idemstore.Response
			stored bool // KeyComplete succeeded
		}
		var (
			mu     sync.Mutex
			gens   []*completion
			byBody = map[string]int{}
		)
		run := func(st *Store, token string) error {
			mu.Lock()
			g := len(gens)
			c := &completion{token: token, resp: &idemstore.Response{Status: 201 + g%3,
				Header: http.Header{"Generation": {strconv.Itoa(g)}},
				Body:   []byte(strings.Repeat(fmt.Sprintf("generation %d by %s;", g, token), 1+g%4))}}
			gens = append(gens, c)
			byBody[string(c.resp.Body)] = g
			mu.Unlock()
			err := st.KeyComplete(ctx, &idemstore.CompleteParams{Identity: testID, Token: token, Response: c.resp})
			if err == nil {
				mu.Lock()
				c.stored = true
				mu.Unlock()
			}
			return err
		}
		// purged is the highest generation a finished purge removed.
		var purged atomic.Int64
		purged.Store(-1)

		// An answer, and the highest purged generation when its
		// reservation began.
		type answer struct {
			floor int64
			token string
			rec   *idemstore.Record
		}
		mustReserve(t, s, reserveParams("t0", idemstore.StateUnknown), true)
		if err := run(s, "t0"); err != nil {
			t.Fatal(err)
		}
		const rounds, workers = 50, 8
		var wg sync.WaitGroup
		done := make(chan struct{})
		errs := make(chan error, workers)
		answers := make([][]answer, workers)
		for w := range workers {
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-done:
						return
					default:
					}
					token := fmt.Sprintf("w%d-%d", w, i)
					floor := purged.Load()
					res, err := s.KeyReserve(ctx, reserveParams(token, idemstore.StateUnknown))
					if err != nil {
						errs <- err
						return
					}
					if !res.Reserved {
						answers[w] = append(answers[w], answer{floor: floor, token: token, rec: res.Record})
						continue
					}
					// The key was free (purged): run it.
					if res.Record.Token != token {
						errs <- fmt.Errorf("reserved with token %q, want %q", res.Record.Token, token)
						return
					}
					if err := run(s, token); err != nil && !errors.Is(err, idemstore.ErrLeaseLost) {
						errs <- err
						return
					}
				}
			})
		}
		for i := range rounds {
			mu.Lock()
			g := int64(len(gens)) - 1
			mu.Unlock()
			if _, err := other.KeyPurge(ctx, &idemstore.PurgeParams{Identity: testID, Force: true}); err != nil && !errors.Is(err, idemstore.ErrNotFound) {
				t.Error(err)
				break
			}
			purged.Store(g)
			token := "o" + strconv.Itoa(i)
			if res, err := other.KeyReserve(ctx, reserveParams(token, idemstore.StateUnknown)); err != nil {
				t.Error(err)
				break
			} else if res.Reserved {
				if err := run(other, token); err != nil && !errors.Is(err, idemstore.ErrLeaseLost) {
					t.Error(err)
					break
				}
			}
		}
		close(done)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}

		// check checks one answer: a record in progress without a
		// response, or a completed one whose response is exactly that of
		// the generation its body names, under the token that stored it,
		// and of a generation past the purges finished before it began.
		check := func(a answer) error {
			rec := a.rec
			switch rec.State {
			case idemstore.StateInProgress:
				if rec.Response != nil {
					return fmt.Errorf("in progress with token %s and a response %+v", rec.Token, rec.Response)
				}
				return nil
			case idemstore.StateCompleted:
			default:
				return fmt.Errorf("answered a record %s with token %s", rec.State, rec.Token)
			}
			if rec.Response == nil {
				return fmt.Errorf("replayed token %s without a response", rec.Token)
			}
			g, ok := byBody[string(rec.Response.Body)]
			if !ok {
				return fmt.Errorf("replayed a body no completion stored: %q (token %s)", rec.Response.Body, rec.Token)
			}
			c := gens[g]
			switch {
			case !c.stored:
				return fmt.Errorf("replayed generation %d, whose completion failed", g)
			case rec.Token != c.token || rec.Response.Status != c.resp.Status || !reflect.DeepEqual(rec.Response.Header, c.resp.Header):
				return fmt.Errorf("replayed a mix: the body of generation %d (token %s, status %d, header %v) with token %s, status %d, header %v",
					g, c.token, c.resp.Status, c.resp.Header, rec.Token, rec.Response.Status, rec.Response.Header)
			case int64(g) <= a.floor:
				return fmt.Errorf("replayed generation %d after a purge of generations up to %d had finished", g, a.floor)
			}
			return nil
		}
		replayed := map[int]bool{}
		bad := 0
		for _, as := range answers {
			for _, a := range as {
				if err := check(a); err != nil {
					if bad++; bad <= 10 {
						t.Errorf("reservation %s: %v", a.token, err)
					}
					continue
				}
				if a.rec.State == idemstore.StateCompleted {
					replayed[byBody[string(a.rec.Response.Body)]] = true
				}
			}
		}
		if bad > 10 {
			t.Errorf("… and %d more wrong answers", bad-10)
		}
		// Not a vacuous pass: replays of several generations, so some
		// came after a purge.
		if len(replayed) < 2 {
			t.Errorf("the replays answered %d generations of %d; want a race that replays after purges", len(replayed), len(gens))
		}
	})
}

// TestReadsMaster checks which clients replay with a GET: not a Cluster
// client that reads from replicas, and not with WaitReplicas.
func TestReadsMaster(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		client redis.UniversalClient
		cfg    *Config
		want   bool
	}{
		"single":             {redis.NewClient(&redis.Options{}), nil, true},
		"single, wait":       {redis.NewClient(&redis.Options{}), &Config{WaitReplicas: 1}, false},
		"ring":               {redis.NewRing(&redis.RingOptions{}), nil, true},
		"cluster":            {redis.NewClusterClient(&redis.ClusterOptions{}), nil, true},
		"cluster read only":  {redis.NewClusterClient(&redis.ClusterOptions{ReadOnly: true}), nil, false},
		"cluster by latency": {redis.NewClusterClient(&redis.ClusterOptions{RouteByLatency: true}), nil, false},
		"cluster randomly":   {redis.NewClusterClient(&redis.ClusterOptions{RouteRandomly: true}), nil, false},
	} {
		if got := New(c.client, c.cfg).getReplays; got != c.want {
			t.Errorf("%s: getReplays = %v, want %v", name, got, c.want)
		}
		c.client.Close()
	}
}

func mustReserve(t *testing.T, s *Store, p *idemstore.ReserveParams, reserved bool) *idemstore.ReserveResult {
	t.Helper()
	res, err := s.KeyReserve(t.Context(), p)
	if err != nil || res.Reserved != reserved {
		t.Fatalf("KeyReserve(%s) = %+v, %v; want reserved %v", p.Token, res, err, reserved)
	}
	return res
}

func complete(t *testing.T, s *Store, token, body string) {
	t.Helper()
	err := s.KeyComplete(t.Context(), &idemstore.CompleteParams{Identity: testID, Token: token,
		Response: &idemstore.Response{Status: 201, Body: []byte(body)}})
	if err != nil {
		t.Fatal(err)
	}
}
