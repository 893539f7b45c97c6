package idemredis

import (
	"context"
	"errors"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemtest"
)

// codecCases are records with the values a codec gets wrong: separators
// and digits in the variable fields, empty ones, bytes that are not UTF-8.
func codecCases() map[string]*recordFields {
	full := func() *recordFields {
		return &recordFields{
			scope: "tenant-a", endpoint: "POST /v1/payments", key: "key-1",
			fingerprint: "3f2a9c0e", state: "completed", token: "0123456789abcdef",
			leaseExpiredState: "unknown", notReplayable: "0", recoveryPoint: "rp",
			lockedUntil: "1764119000000000", startedAt: "1764118000000000",
			createdAt: "1764118000000001", updatedAt: "1764118000000002",
			expiresAt: "1764121600000000", attempts: "3", status: "201",
			header: `{"Content-Type":["application/json"]}`, body: `{"id":"pay_123"}`,
			ttl: "3600000000", reconcileAfter: "0", reconcileAttempts: "0",
			waiters: "0", hasStatus: true,
		}
	}
	cases := map[string]*recordFields{"full": full()}
	sep := full()
	sep.scope, sep.endpoint, sep.key = "a,b;c", ";,;", "1,2;3"
	sep.token, sep.fingerprint, sep.recoveryPoint = ",", ";", "12,"
	sep.reconcileError, sep.header = "2,;x", `{"A":["1,2;3",";"]}`
	sep.body = "\x00\xff;,2,"
	cases["separators"] = sep
	empty := full()
	empty.scope, empty.endpoint, empty.token, empty.fingerprint = "", "", "", ""
	empty.header, empty.body, empty.recoveryPoint = "", "", ""
	cases["empty"] = empty
	inProgress := full()
	inProgress.state, inProgress.status, inProgress.hasStatus = "in_progress", "", false
	inProgress.header, inProgress.body = "", ""
	inProgress.lockedUntil, inProgress.waiters = "-5", "12"
	cases["in progress"] = inProgress
	unknown := full()
	unknown.state, unknown.notReplayable, unknown.status, unknown.hasStatus = "unknown", "1", "", false
	unknown.reconcileAfter, unknown.reconcileAttempts, unknown.reconcileError = "1764118000000099", "4", "timeout"
	cases["unknown"] = unknown
	return cases
}

// TestCodecGoAndLua checks that Go and the scripts read and write records
// alike: what Go encodes, lib.lua's decode reads field by field and its
// encode writes back byte for byte; what Go decodes from that is the
// record.
func TestCodecGoAndLua(t *testing.T) {
	t.Parallel()
	client := sharedClient(t)
	lib, err := luaFiles.ReadFile("lua/lib.lua")
	if err != nil {
		t.Fatal(err)
	}
	fields := []string{"state", "lease_expired_state", "locked_until", "expires_at", "ttl",
		"created_at", "started_at", "updated_at", "attempts", "reconcile_after",
		"reconcile_attempts", "waiters", "not_replayable", "status", "token",
		"fingerprint", "scope", "endpoint", "key", "recovery_point", "reconcile_error",
		"header", "body"}
	script := redis.NewScript(string(lib) + `
local r = decode(ARGV[1])
local out = {encode(r)}
for i = 2, #ARGV do
  table.insert(out, r[ARGV[i]])
end
return out`)
	for name, f := range codecCases() {
		t.Run(name, func(t *testing.T) {
			v := encodeFields(f)
			args := []any{v}
			for _, n := range fields {
				args = append(args, n)
			}
			out, err := script.Run(t.Context(), client, nil, args...).StringSlice()
			if err != nil {
				t.Fatal(err)
			}
			if out[0] != v {
				t.Fatalf("Lua re-encoded\n%q\nas\n%q", v, out[0])
			}
			var m recordFields
			for i, n := range fields {
				m.set(n, out[i+1])
			}
			m.hasStatus = m.status != ""
			if !reflect.DeepEqual(&m, f) {
				t.Fatalf("Lua decoded %+v, want %+v", m, *f)
			}
			var g recordFields
			if err := g.parse(v); err != nil || !reflect.DeepEqual(&g, f) {
				t.Fatalf("Go decoded %+v, %v; want %+v", g, err, *f)
			}
			want, err := f.record(nil)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := decodeRecord(out[0]); err != nil || !reflect.DeepEqual(got, want) {
				t.Fatalf("decodeRecord = %+v, %v; want %+v", got, err, want)
			}
		})
	}
}

// TestNewRecordValue checks that the record a reservation sends is the one
// newRecord returns, as encodeFields writes it.
func TestNewRecordValue(t *testing.T) {
	t.Parallel()
	now := time.UnixMicro(1764118000000001)
	for _, les := range []idemstore.State{idemstore.StateUnknown, idemstore.StateReleased} {
		p := &idemstore.ReserveParams{Identity: idemstore.Identity{Scope: "s,1", Endpoint: "POST /x", Key: "k;2"},
			Fingerprint: "fp", Token: "tok", Lease: 30 * time.Second, TTL: time.Hour, LeaseExpiredState: les}
		v, nowDigits, lockedDigits := newRecordValue(p, les, now.UnixMicro(), now.Add(p.Lease).UnixMicro(), now.Add(p.TTL).UnixMicro(), p.TTL.Microseconds())
		if nowDigits != micros(now) || lockedDigits != micros(now.Add(p.Lease)) {
			t.Fatalf("newRecordValue's digits of now and the lease end: %q and %q, want %q and %q",
				nowDigits, lockedDigits, micros(now), micros(now.Add(p.Lease)))
		}
		got, err := decodeRecord(v)
		if err != nil {
			t.Fatal(err)
		}
		want := newRecord(p, les, now).Record
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("newRecordValue decodes to %+v, want %+v", got, want)
		}
		var f recordFields
		if err := f.parse(v); err != nil {
			t.Fatal(err)
		}
		if again := encodeFields(&f); again != v {
			t.Fatalf("newRecordValue wrote %q, encodeFields %q", v, again)
		}
	}
}

// TestParseRejects checks that a value that is not a record, or whose
// lengths point past its end, is an error, never a panic or a record.
func TestParseRejects(t *testing.T) {
	t.Parallel()
	v := encodeFields(codecCases()["full"])
	for _, bad := range []string{"", ";", "2", "1" + v[1:], v[:len(v)-20], "2,completed;x"} {
		if r, err := decodeRecord(bad); err == nil {
			t.Errorf("decodeRecord(%q) = %+v, want an error", bad, r)
		}
	}
	var f recordFields
	if err := f.parsePrefix(v[:10]); !errors.Is(err, errShort) {
		t.Errorf("parsePrefix of a cut head = %v, want errShort", err)
	}
	full := codecCases()["full"]
	cut := encodeFields(full)
	// Cut inside the recovery point, after the key.
	cut = cut[:len(cut)-len(full.body)-len(full.header)-len(full.reconcileError)-1]
	if err := f.parsePrefix(cut); err != nil || f.key != full.key {
		t.Errorf("parsePrefix past the key = %v, key %q; want the identity", err, f.key)
	}
}

// FuzzDecodeValue checks that decodeRecord never panics and that what it
// accepts encodes back to the same value.
func FuzzDecodeValue(f *testing.F) {
	for _, c := range codecCases() {
		f.Add(encodeFields(c))
	}
	f.Fuzz(func(t *testing.T, v string) {
		var fields recordFields
		if err := fields.parse(v); err != nil {
			return
		}
		if _, err := decodeRecord(v); err != nil {
			return
		}
		if again := encodeFields(&fields); again != v && canonical(v) {
			t.Fatalf("%q encodes back as %q", v, again)
		}
	})
}

// canonical reports whether v's lengths and numbers are written as
// encodeFields writes them (no leading zeros or signs).
func canonical(v string) bool {
	return !regexp.MustCompile(`[,;]0\d|[,;]\+|[,;]-0|^2,[^;]*,,`).MatchString(v)
}

// TestLuaConstants checks that lib.lua's constants are store.go's.
func TestLuaConstants(t *testing.T) {
	t.Parallel()
	lib, err := luaFiles.ReadFile("lua/lib.lua")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int64{
		"TTL_SLACK_MS":   ttlSlack.Milliseconds(),
		"PRUNE_AFTER_US": pruneAfter.Microseconds(),
	} {
		m := regexp.MustCompile(`local ` + name + ` = (\d+)`).FindSubmatch(lib)
		if m == nil {
			t.Fatalf("%s is not in lib.lua", name)
		}
		if got, _ := strconv.ParseInt(string(m[1]), 10, 64); got != want {
			t.Errorf("%s = %d in lib.lua, %d in Go", name, got, want)
		}
	}
}

// TestPublishOnlyToWaiters checks that a change nobody waits for publishes
// nothing, and that one a KeyWait registered for does.
func TestPublishOnlyToWaiters(t *testing.T) {
	t.Parallel()
	client := sharedClient(t)
	s := newTestStore(t, client, time.Now)
	ctx := t.Context()
	channel := s.keysOf(testID).channel
	ps, err := s.subscribe(ctx, channel)
	if err != nil {
		t.Fatal(err)
	}
	defer ps.Close()
	// The next message on the channel: the scripts publish "1".
	next := func() string {
		select {
		case m := <-ps.Channel():
			return m.Payload
		case <-time.After(10 * time.Second):
			t.Fatal("no message on the channel")
		}
		return ""
	}
	marker := func() {
		if err := client.SPublish(ctx, channel, "marker").Err(); err != nil {
			t.Fatal(err)
		}
	}

	if _, err := s.KeyReserve(ctx, reserveParams("t1", "")); err != nil {
		t.Fatal(err)
	}
	if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: testID, Token: "t1", Response: &idemstore.Response{Status: 200}}); err != nil {
		t.Fatal(err)
	}
	marker()
	if m := next(); m != "marker" {
		t.Fatalf("a completion nobody waited for published %q", m)
	}

	// A waiter registers on a record in progress: its release publishes.
	id := testID
	id.Key = "waited"
	channel2 := s.keysOf(id).channel
	ps2, err := s.subscribe(ctx, channel2)
	if err != nil {
		t.Fatal(err)
	}
	defer ps2.Close()
	p := reserveParams("t2", "")
	p.Identity = id
	if _, err := s.KeyReserve(ctx, p); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := s.KeyWait(short, id); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("KeyWait = %v, want DeadlineExceeded", err)
	}
	if err := s.KeyRelease(ctx, &idemstore.FinishParams{Identity: id, Token: "t2"}); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-ps2.Channel():
		if m.Payload != "1" {
			t.Fatalf("the release published %q", m.Payload)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the release of a waited-for record published nothing")
	}
	// The release woke the waiters: the count starts afresh.
	if _, err := s.KeyReserve(ctx, p); err != nil {
		t.Fatal(err)
	}
	if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: id, Token: "t2", Response: &idemstore.Response{Status: 200}}); err != nil {
		t.Fatal(err)
	}
	if err := client.SPublish(ctx, channel2, "marker").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-ps2.Channel():
		if m.Payload != "marker" {
			t.Fatalf("a completion after the waiters were woken published %q", m.Payload)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no marker")
	}
}

// legacyHash is a record as the earlier layout stored it: the hash that
// reserve.lua and complete.lua of that version wrote.
func legacyHash(id idemstore.Identity, state idemstore.State, token string, now time.Time) []any {
	at := func(t time.Time) string { return strconv.FormatInt(t.UnixMicro(), 10) }
	h := []any{
		"scope", id.Scope, "endpoint", id.Endpoint, "key", id.Key,
		"fingerprint", "fp", "state", string(state), "token", token,
		"locked_until", at(now.Add(30 * time.Second)), "started_at", at(now),
		"lease_expired_state", "unknown", "attempts", "1",
		"created_at", at(now), "updated_at", at(now), "expires_at", at(now.Add(time.Hour)),
		"ttl", strconv.FormatInt(time.Hour.Microseconds(), 10),
	}
	if state == idemstore.StateCompleted {
		h = append(h, "status", "201", "header", `{"Location":["/p/1"]}`, "body", "paid")
	}
	return h
}

// TestLegacyHashRecords checks that records of the earlier layout (hashes)
// are read by every path and rewritten as strings by their next write.
func TestLegacyHashRecords(t *testing.T) {
	t.Parallel()
	client := sharedClient(t)
	clock := idemtest.NewClock(time.Now().Truncate(time.Second))
	s := newTestStore(t, client, clock.Now)
	ctx := t.Context()
	ids := map[string]idemstore.Identity{}
	for _, name := range []string{"completed", "in-progress", "expiring"} {
		id := testID
		id.Key = name
		ids[name] = id
		state := idemstore.StateInProgress
		if name == "completed" {
			state = idemstore.StateCompleted
		}
		k := s.keysOf(id)
		if err := client.HSet(ctx, k.record, legacyHash(id, state, "t-"+name, clock.Now())...).Err(); err != nil {
			t.Fatal(err)
		}
		if state == idemstore.StateInProgress {
			client.ZAdd(ctx, k.index, redis.Z{Score: float64(clock.Now().Add(30 * time.Second).UnixMicro()), Member: k.member})
		}
		client.ZAdd(ctx, k.expiry, redis.Z{Score: float64(clock.Now().Add(time.Hour).UnixMicro()), Member: k.member})
	}
	typeOf := func(id idemstore.Identity) string { return client.Type(ctx, s.keysOf(id).record).Val() }

	// Reads: KeyGet, a replay, KeyList.
	r, err := s.KeyGet(ctx, ids["completed"])
	if err != nil || r.State != idemstore.StateCompleted || string(r.Response.Body) != "paid" || r.Response.Header.Get("Location") != "/p/1" {
		t.Fatalf("KeyGet of a hash record = %+v, %v", r, err)
	}
	p := &idemstore.ReserveParams{Identity: ids["completed"], Fingerprint: "fp", Token: "retry", Lease: time.Minute, TTL: time.Hour}
	res, err := s.KeyReserve(ctx, p)
	if err != nil || res.Reserved || !reflect.DeepEqual(res.Record, r) {
		t.Fatalf("replay of a hash record = %+v, %v; want %+v", res, err, r)
	}
	if typ := typeOf(ids["completed"]); typ != "hash" {
		t.Fatalf("a replay rewrote the record as a %s: a replay writes nothing", typ)
	}
	list, err := s.KeyList(ctx, &idemstore.ListParams{})
	if err != nil || len(list) != 3 {
		t.Fatalf("KeyList = %v, %v; want the 3 hash records", identities(list), err)
	}

	// Writes: a completion, a lease that expires (the sweeper).
	if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: ids["in-progress"], Token: "t-in-progress", Response: &idemstore.Response{Status: 200, Body: []byte("ok")}}); err != nil {
		t.Fatalf("KeyComplete of a hash record: %v", err)
	}
	if typ := typeOf(ids["in-progress"]); typ != "string" {
		t.Fatalf("a completed hash record is a %s, want a string", typ)
	}
	if r, err := s.KeyGet(ctx, ids["in-progress"]); err != nil || r.State != idemstore.StateCompleted || string(r.Response.Body) != "ok" || r.Scope != testID.Scope {
		t.Fatalf("KeyGet after the completion = %+v, %v", r, err)
	}
	clock.Advance(time.Minute)
	swept, err := s.KeySweep(ctx, &idemstore.SweepParams{})
	if err != nil || len(swept) != 1 || swept[0].Identity != ids["expiring"] || swept[0].State != idemstore.StateUnknown {
		t.Fatalf("KeySweep = %v, %v; want the expiring hash record, unknown", identities(swept), err)
	}
	if ttl := client.PTTL(ctx, s.keysOf(ids["expiring"]).record).Val(); ttl != -1 {
		t.Fatalf("the unknown record has a native TTL of %v", ttl)
	}
}

func identities(rs []*idemstore.Record) []idemstore.Identity {
	var out []idemstore.Identity
	for _, r := range rs {
		out = append(out, r.Identity)
	}
	return out
}

// TestExpiryIndexPruned checks that a completion whose member ends in 0
// drops up to 64 stale entries (an hour past due) of its bucket's expiry
// index, and that other completions drop none.
func TestExpiryIndexPruned(t *testing.T) {
	t.Parallel()
	client := sharedClient(t)
	clock := idemtest.NewClock(time.Now().Truncate(time.Second))
	s := newTestStore(t, client, clock.Now)
	ctx := t.Context()
	find := func(prune bool) idemstore.Identity {
		for i := 0; ; i++ {
			id := testID
			id.Key = "k" + strconv.Itoa(i)
			if m := s.keysOf(id).member; (m[len(m)-1] == '0') == prune {
				return id
			}
		}
	}
	for _, prune := range []bool{false, true} {
		id := find(prune)
		k := s.keysOf(id)
		stale := clock.Now().Add(-pruneAfter - time.Minute).UnixMicro()
		for i := range 100 {
			client.ZAdd(ctx, k.expiry, redis.Z{Score: float64(stale + int64(i)), Member: "stale-" + strconv.Itoa(i)})
		}
		p := reserveParams("t", "")
		p.Identity = id
		if _, err := s.KeyReserve(ctx, p); err != nil {
			t.Fatal(err)
		}
		if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: id, Token: "t", Response: &idemstore.Response{Status: 200}}); err != nil {
			t.Fatal(err)
		}
		want := int64(101) // the stale entries and the record's
		if prune {
			want = 101 - 64
		}
		if n := client.ZCard(ctx, k.expiry).Val(); n != want {
			t.Errorf("member %s: expiry index of %d entries, want %d", k.member, n, want)
		}
		if _, err := client.ZScore(ctx, k.expiry, k.member).Result(); err != nil {
			t.Errorf("the completed record is not in the expiry index: %v", err)
		}
		client.Del(ctx, k.expiry)
	}
}

// TestReapInProgressPastRetention checks that KeyReap finds an in-progress
// record whose lease outlives its retention (it is gone past ExpiresAt
// while its lease runs), whether the reservation or a renewal made the
// lease that long.
func TestReapInProgressPastRetention(t *testing.T) {
	t.Parallel()
	client := sharedClient(t)
	clock := idemtest.NewClock(time.Now().Truncate(time.Second))
	s := newTestStore(t, client, clock.Now)
	ctx := t.Context()
	long := testID
	long.Key = "lease-longer-than-ttl"
	p := &idemstore.ReserveParams{Identity: long, Fingerprint: "fp", Token: "t1", Lease: time.Hour, TTL: time.Minute}
	if _, err := s.KeyReserve(ctx, p); err != nil {
		t.Fatal(err)
	}
	renewed := testID
	renewed.Key = "renewed-past-ttl"
	p2 := &idemstore.ReserveParams{Identity: renewed, Fingerprint: "fp", Token: "t2", Lease: 30 * time.Second, TTL: time.Minute}
	if _, err := s.KeyReserve(ctx, p2); err != nil {
		t.Fatal(err)
	}
	if err := s.KeyRenew(ctx, &idemstore.RenewParams{Identity: renewed, Token: "t2", Lease: time.Hour}); err != nil {
		t.Fatal(err)
	}
	short := testID
	short.Key = "lease-within-ttl"
	p3 := &idemstore.ReserveParams{Identity: short, Fingerprint: "fp", Token: "t3", Lease: 30 * time.Second, TTL: time.Hour}
	if _, err := s.KeyReserve(ctx, p3); err != nil {
		t.Fatal(err)
	}
	if k := s.keysOf(short); client.ZScore(ctx, k.expiry, k.member).Err() != redis.Nil {
		t.Errorf("an in-progress record whose lease ends within its retention is in the expiry index")
	}
	clock.Advance(2 * time.Minute)
	for _, id := range []idemstore.Identity{long, renewed} {
		if _, err := s.KeyGet(ctx, id); !errors.Is(err, idemstore.ErrNotFound) {
			t.Fatalf("KeyGet of %s past its retention = %v, want ErrNotFound", id.Key, err)
		}
	}
	if n, err := s.KeyReap(ctx, &idemstore.ReapParams{}); err != nil || n != 2 {
		t.Fatalf("KeyReap = %d, %v; want 2", n, err)
	}
}

// TestCompleteAfterChange completes records that changed since their
// reservation (renewed, or with a waiter registered): complete.lua finds
// another record than the one KeyReserve wrote and takes the response from
// the record the caller built for the one it expected.
func TestCompleteAfterChange(t *testing.T) {
	ctx := t.Context()
	s := newTestStore(t, sharedClient(t), time.Now)
	for name, change := range map[string]func(id idemstore.Identity, token string){
		"renewed": func(id idemstore.Identity, token string) {
			if err := s.KeyRenew(ctx, &idemstore.RenewParams{Identity: id, Token: token, Lease: time.Minute}); err != nil {
				t.Fatal(err)
			}
		},
		"waited": func(id idemstore.Identity, token string) {
			short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
			defer cancel()
			_ = s.KeyWait(short, id)
		},
		"unchanged": func(idemstore.Identity, string) {},
	} {
		t.Run(name, func(t *testing.T) {
			id := idemstore.Identity{Scope: "s", Endpoint: "POST /x", Key: "change-" + name}
			res, err := s.KeyReserve(ctx, &idemstore.ReserveParams{Identity: id, Fingerprint: "fp", Token: "tok-" + name, Lease: time.Minute, TTL: time.Hour})
			if err != nil || !res.Reserved {
				t.Fatalf("KeyReserve = %v, %v", res, err)
			}
			before := s.client.Get(ctx, s.keysOf(id).record).Val()
			change(id, "tok-"+name)
			// The case the test is for: the record changed (or, unchanged,
			// did not) since the reservation wrote it.
			if after := s.client.Get(ctx, s.keysOf(id).record).Val(); (after != before) != (name != "unchanged") {
				t.Fatalf("the record went from\n%q\nto\n%q", before, after)
			}
			if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: id, Token: "tok-" + name, Response: benchResponse}); err != nil {
				t.Fatal(err)
			}
			r, err := s.KeyGet(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if r.State != idemstore.StateCompleted || r.Response == nil || r.Response.Status != benchResponse.Status ||
				string(r.Response.Body) != string(benchResponse.Body) || r.Response.Header.Get("Location") != "/v1/payments/pay_123" {
				t.Fatalf("record after complete: %+v, response %+v", r, r.Response)
			}
			if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: id, Token: "tok-" + name, Response: benchResponse}); !errors.Is(err, idemstore.ErrLeaseLost) {
				t.Fatalf("second KeyComplete = %v, want ErrLeaseLost", err)
			}
		})
	}
}

// TestCompletedValueMatchesScript checks that completedValue writes what
// complete.lua's decoding path writes for the same record and time: the
// fast path of a completion is the same transition.
func TestCompletedValueMatchesScript(t *testing.T) {
	ctx := t.Context()
	at := time.Now().Truncate(time.Second)
	s := newTestStore(t, sharedClient(t), func() time.Time { return at })
	for name, resp := range map[string]*idemstore.Response{
		"response":       benchResponse,
		"not replayable": nil,
		"no header":      {Status: 204},
	} {
		id := idemstore.Identity{Scope: "s", Endpoint: "POST /x", Key: "cv-" + name}
		if _, err := s.KeyReserve(ctx, &idemstore.ReserveParams{Identity: id, Fingerprint: "fp", Token: "tok", Lease: time.Minute, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
		// Forget the reservation: the script decodes the record.
		reserved := s.keys.takeWritten(id)
		enc, err := encodeResponse(resp, resp == nil)
		if err != nil {
			t.Fatal(err)
		}
		want, proof, ttl, score, ok := completedValue(reserved, us(at), "tok", enc)
		if !ok {
			t.Fatalf("%s: completedValue refused the record it reserved: %q", name, reserved)
		}
		if head, _, _ := strings.Cut(reserved, ";"); proof != head+";tok" {
			t.Errorf("%s: proof %q of %q, want its head and token", name, proof, reserved)
		}
		if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: id, Token: "tok", Response: resp, NotReplayable: resp == nil}); err != nil {
			t.Fatal(err)
		}
		got, err := s.client.Get(ctx, s.keysOf(id).record).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s: complete.lua wrote\n%q\ncompletedValue\n%q", name, got, want)
		}
		if pttl := s.client.PTTL(ctx, s.keysOf(id).record).Val().Milliseconds(); pttl > ttl || pttl < ttl-5000 {
			t.Errorf("%s: Redis TTL %d ms, completedValue %d ms", name, pttl, ttl)
		}
		if sc, err := s.client.ZScore(ctx, s.keysOf(id).expiry, s.keysOf(id).member).Result(); err != nil || strconv.FormatFloat(sc, 'f', -1, 64) != score {
			t.Errorf("%s: expiry score %v (%v), completedValue %s", name, sc, err, score)
		}
	}
}
