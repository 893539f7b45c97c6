package idemredis_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemredis"
	"github.com/idem-dev/idem/internal/benchkit"
	"github.com/idem-dev/idem/internal/testenv"
)

// The Redis benchmarks compare requests through the middleware on idemredis
// with a bare go-redis loop that sends the same commands (the same Lua
// scripts, EVALSHA or FCALL of the same digests or functions, with the same
// arguments) (the Raw benchmarks).
//
// As on PostgreSQL, the raw loop copies nothing from the store: a hook on
// the client records the commands the middleware sends for one request, and
// the loop sends those, with the time, key, token and the record's key names
// changed. A new key is two scripts (reserve, complete), a replay of a key
// the store completed one GET of its record.
//
// Both sides run GOMAXPROCS×redisBenchParallelism goroutines on one client.
// The Raw benchmarks have the two variants of the PostgreSQL ones
// (benchkit.RawVariants).
//
//	go test -run '^$' -bench 'Redis(NewKey|Replay)$' -count 6 .
//
// With IDEM_BENCH_REDIS_CPU=1, when the Redis at IDEM_TEST_REDIS_URL serves
// the benchmark alone (a redis-server of its own), they also report the
// server's work per operation (see redisWork).

const redisBenchParallelism = 4

// cmdRecorder is a redis.Hook that records the commands sent while it is
// on.
type cmdRecorder struct {
	benchkit.Recorder[[]any]
}

func (r *cmdRecorder) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *cmdRecorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.Add(func() []any { return append([]any(nil), cmd.Args()...) })
		return next(ctx, cmd)
	}
}

func (r *cmdRecorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// redisBench is an idemredis store under a prefix of its own, on a client
// whose commands can be recorded, and the middleware on it.
type redisBench struct {
	client *redis.Client
	rec    *cmdRecorder
	mw     http.Handler
}

func newRedisBench(b *testing.B) *redisBench {
	b.Helper()
	opts, err := redis.ParseURL(testenv.RedisURL(b))
	if err != nil {
		b.Fatal(err)
	}
	client := redis.NewClient(opts)
	rec := &cmdRecorder{}
	client.AddHook(rec)
	var r [6]byte
	rand.Read(r[:])
	prefix := "idembench:" + hex.EncodeToString(r[:]) + ":"
	b.Cleanup(func() {
		defer client.Close()
		ctx := context.Background()
		iter := client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
			if len(keys) == 1000 {
				client.Unlink(ctx, keys...)
				keys = keys[:0]
			}
		}
		if len(keys) > 0 {
			client.Unlink(ctx, keys...)
		}
		if err := iter.Err(); err != nil {
			b.Errorf("deleting the benchmark's keys: %v", err)
		}
	})
	store := idemredis.New(client, &idemredis.Config{Prefix: prefix})
	return &redisBench{client: client, rec: rec, mw: idem.New(store, &idem.Config{GuardConfig: idem.GuardConfig{Logger: benchkit.DiscardLogger()}})(benchkit.Handler)}
}

// serve sends one request with key through the middleware and checks the
// answer: 201, replayed or not.
func (p *redisBench) serve(b *testing.B, key, body string, replayed bool) {
	w := httptest.NewRecorder()
	p.mw.ServeHTTP(w, benchkit.RequestBody(key, body))
	want := ""
	if replayed {
		want = "true"
	}
	if w.Code != http.StatusCreated || w.Header().Get(idem.HeaderReplayed) != want {
		b.Fatalf("key %s: %d, %s=%q, want 201 and %q\n%s", key, w.Code, idem.HeaderReplayed, w.Header().Get(idem.HeaderReplayed), want, w.Body)
	}
}

// scriptCall is a recorded EVALSHA: the script's digest, its keys and its
// arguments.
type scriptCall struct {
	cmd  string // evalsha or fcall
	sha  string // the digest, or the function's name
	keys []string
	args []any
}

// run sends the call again, with keys and args.
func (c scriptCall) run(ctx context.Context, client *redis.Client, keys []string, args []any) *redis.Cmd {
	cmd := make([]any, 0, 3+len(keys)+len(args))
	cmd = append(cmd, c.cmd, c.sha, len(keys))
	for _, k := range keys {
		cmd = append(cmd, k)
	}
	return client.Do(ctx, append(cmd, args...)...)
}

func parseScriptCall(b *testing.B, cmd []any) scriptCall {
	b.Helper()
	if len(cmd) < 3 || fmt.Sprint(cmd[0]) != "evalsha" && fmt.Sprint(cmd[0]) != "fcall" {
		b.Fatalf("recorded %v, want an evalsha or an fcall", cmd)
	}
	n, err := strconv.Atoi(fmt.Sprint(cmd[2]))
	if err != nil || len(cmd) < 3+n {
		b.Fatalf("recorded %v: bad number of keys", cmd)
	}
	c := scriptCall{cmd: fmt.Sprint(cmd[0]), sha: fmt.Sprint(cmd[1]), args: cmd[3+n:]}
	for _, k := range cmd[3 : 3+n] {
		c.keys = append(c.keys, fmt.Sprint(k))
	}
	return c
}

// learn sends a first request and its replay (which load the scripts),
// then records the commands of one request with a new key and of one
// replay of it, and checks their number. The replay, of a key the store
// completed, is a GET of the record.
func (p *redisBench) learn(b *testing.B) (reserve, complete scriptCall, replay []any) {
	b.Helper()
	p.serve(b, "warm-up", benchkit.Body, false)
	p.serve(b, "warm-up", benchkit.Body, true)
	cmds := p.rec.Record(func() { p.serve(b, "probe", benchkit.Body, false) })
	if len(cmds) != 2 {
		b.Fatalf("a new key sent %d commands, want 2 (reserve, complete): %v", len(cmds), cmds)
	}
	replays := p.rec.Record(func() { p.serve(b, "probe", benchkit.Body, true) })
	if len(replays) != 1 {
		b.Fatalf("a replay sent %d commands, want 1 (GET): %v", len(replays), replays)
	}
	reserve, complete, replay = parseScriptCall(b, cmds[0]), parseScriptCall(b, cmds[1]), replays[0]
	if len(replay) != 2 || fmt.Sprint(replay[0]) != "get" || fmt.Sprint(replay[1]) != reserve.keys[0] {
		b.Fatalf("the replay sent %v, want a GET of %s", replay, reserve.keys[0])
	}
	return reserve, complete, replay
}

// BenchmarkMiddlewareRedisNewKey sends requests with new keys through the
// middleware on Redis: reserve script, handler, complete script.
func BenchmarkMiddlewareRedisNewKey(b *testing.B) {
	p := newRedisBench(b)
	p.learn(b)
	var n atomic.Int64
	b.SetParallelism(redisBenchParallelism)
	b.ReportAllocs()
	work := startRedisWork(b, p.client)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			p.serve(b, "key-"+strconv.FormatInt(i, 10), benchkit.BodyN(i), false)
		}
	})
	work.report()
}

// BenchmarkMiddlewareRedisReplay replays one completed key through the
// middleware on Redis: one reserve script that reads the record.
func BenchmarkMiddlewareRedisReplay(b *testing.B) {
	p := newRedisBench(b)
	p.learn(b)
	b.SetParallelism(redisBenchParallelism)
	b.ReportAllocs()
	work := startRedisWork(b, p.client)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p.serve(b, "probe", benchkit.Body, true)
		}
	})
	work.report()
}

// The positions of the reserve arguments the raw loop changes (ARGV[1] is 0
// here), named by the store's argument builder.
var reserveArg = idemredis.ReserveArgv

// micros reads a recorded time argument (decimal Unix microseconds).
func micros(b *testing.B, v any) int64 {
	n, err := strconv.ParseInt(fmt.Sprint(v), 10, 64)
	if err != nil {
		b.Fatalf("recorded time %v: %v", v, err)
	}
	return n
}

// reserveTimes are the offset from now of the reserve script's lease end,
// as recorded, and the builder of its record argument.
type reserveTimes struct {
	lockedUntil int64
	record      func(key, token string, now int64) string
}

func reserveTimesOf(b *testing.B, c scriptCall) reserveTimes {
	now := micros(b, c.args[reserveArg.Now])
	return reserveTimes{
		lockedUntil: micros(b, c.args[reserveArg.LockedUntil]) - now,
		record:      idemredis.NewRecordBuilder(fmt.Sprint(c.args[reserveArg.Record])),
	}
}

// set writes a reserve call at now for key and token into args.
func (t reserveTimes) set(args []any, key, token string, now int64) {
	args[reserveArg.Now] = strconv.FormatInt(now, 10)
	args[reserveArg.LockedUntil] = strconv.FormatInt(now+t.lockedUntil, 10)
	args[reserveArg.Record] = t.record(key, token, now)
}

// BenchmarkRawRedisNewKey is BenchmarkMiddlewareRedisNewKey's two scripts
// in a bare go-redis loop. Each key gets a member of its own in one of the
// store's 1024 buckets, the names made from the recorded ones.
func BenchmarkRawRedisNewKey(b *testing.B) {
	for _, v := range benchkit.RawVariants {
		b.Run(v.Name, func(b *testing.B) { rawRedisNewKey(b, v.Handler) })
	}
}

func rawRedisNewKey(b *testing.B, handler bool) {
	p := newRedisBench(b)
	reserve, complete, _ := p.learn(b)
	times := reserveTimesOf(b, reserve)
	// The completion of each record, as KeyComplete sends it.
	completeOf := idemredis.NewCompleteBuilder(complete.args)
	// The record's name ends with its member (the scripts read it there).
	member := reserve.keys[0][len(reserve.keys[0])-64:]
	tag := reserve.keys[0][strings.IndexByte(reserve.keys[0], '{') : strings.IndexByte(reserve.keys[0], '}')+1]
	rename := func(name, newTag, newMember string) string {
		return strings.Replace(strings.Replace(name, tag, newTag, 1), member, newMember, 1)
	}
	ctx := context.Background()
	var n atomic.Int64
	b.SetParallelism(redisBenchParallelism)
	b.ReportAllocs()
	work := startRedisWork(b, p.client)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		rkeys := make([]string, len(reserve.keys))
		ckeys := make([]string, len(complete.keys))
		rargs := append([]any(nil), reserve.args...)
		for pb.Next() {
			i := n.Add(1)
			key := "key-" + strconv.FormatInt(i, 10)
			m := rawMember(i)
			t := fmt.Sprintf("{%03x}", i%1024)
			for j, k := range reserve.keys {
				rkeys[j] = rename(k, t, m)
			}
			for j, k := range complete.keys {
				ckeys[j] = rename(k, t, m)
			}
			token := m[:32]
			times.set(rargs, key, token, time.Now().UnixMicro())
			v, err := reserve.run(ctx, p.client, rkeys, rargs).Result()
			if err != nil || v != int64(1) {
				b.Fatalf("reserve: %v (%v)", err, v)
			}
			if handler {
				benchkit.BareRequest(key, benchkit.BodyN(i))
			}
			cargs := completeOf(rargs[reserveArg.Record].(string), time.Now().UnixMicro())
			if err := complete.run(ctx, p.client, ckeys, cargs).Err(); err != nil {
				b.Fatalf("complete: %v", err)
			}
		}
	})
	work.report()
}

// rawMember names the raw loop's record number i as the store names a
// record: 64 hex digits (the store's are a SHA-256 of the record's identity).
// The first 32 are the request's fencing token, as long as the middleware's.
func rawMember(i int64) string {
	sum := sha256.Sum256(strconv.AppendInt(nil, i, 10))
	return hex.EncodeToString(sum[:])
}

// BenchmarkRawRedisReplay is BenchmarkMiddlewareRedisReplay's GET in a
// bare go-redis loop.
func BenchmarkRawRedisReplay(b *testing.B) {
	for _, v := range benchkit.RawVariants {
		b.Run(v.Name, func(b *testing.B) { rawRedisReplay(b, v.Handler) })
	}
}

func rawRedisReplay(b *testing.B, handler bool) {
	p := newRedisBench(b)
	_, _, replay := p.learn(b)
	record := fmt.Sprint(replay[1])
	ctx := context.Background()
	b.SetParallelism(redisBenchParallelism)
	b.ReportAllocs()
	work := startRedisWork(b, p.client)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			v, err := p.client.Get(ctx, record).Result()
			if err != nil || v == "" {
				b.Fatalf("replay: %v (%v)", err, v)
			}
			if handler {
				benchkit.BareRequest("probe", benchkit.Body)
			}
		}
	})
	work.report()
}

// redisWork measures the Redis server's work over a benchmark's loop: the
// CPU time of the server process (user + system, as getrusage gives it to
// INFO cpu: /proc/PID/stat's utime + stime at microsecond resolution) and
// the time its commands ran (INFO commandstats), per operation. It is on
// only with IDEM_BENCH_REDIS_CPU=1, and then the server must serve the
// benchmark alone.
type redisWork struct {
	b      *testing.B
	client *redis.Client
	cpu    float64 // seconds, at the start
}

func startRedisWork(b *testing.B, client *redis.Client) *redisWork {
	if os.Getenv("IDEM_BENCH_REDIS_CPU") != "1" {
		return nil
	}
	ctx := context.Background()
	if err := client.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	return &redisWork{b: b, client: client, cpu: redisInfoCPU(b, client)}
}

// report reports, per operation: redis-cpu-µs (the server's CPU time),
// redis-script-µs (the time EVALSHA, EVAL and FCALL ran, the commands they
// call included) and redis-calls (the other commands: those the scripts
// called, and a replay's GET); it logs the calls of each command and the
// time they ran, per operation.
func (w *redisWork) report() {
	if w == nil {
		return
	}
	b := w.b
	b.StopTimer()
	cpu := redisInfoCPU(b, w.client) - w.cpu
	stats := redisInfo(b, w.client, "commandstats")
	n := float64(b.N)
	var script, calls float64
	var each []string
	for name, v := range stats {
		name = strings.TrimPrefix(name, "cmdstat_")
		c, us := commandStat(v)
		switch {
		case name == "evalsha", name == "eval", name == "fcall":
			script += us
		case name == "info", strings.HasPrefix(name, "config"):
		default:
			calls += c
			each = append(each, fmt.Sprintf("%s %.2f (%.2f µs)", name, c/n, us/n))
		}
	}
	b.ReportMetric(cpu*1e6/n, "redis-cpu-µs/op")
	b.ReportMetric(script/n, "redis-script-µs/op")
	b.ReportMetric(calls/n, "redis-calls/op")
	b.Logf("commands per operation (N=%d): %s", b.N, strings.Join(each, ", "))
}

// redisInfoCPU returns the server's CPU time so far, user + system, in
// seconds.
func redisInfoCPU(b *testing.B, client *redis.Client) float64 {
	m := redisInfo(b, client, "cpu")
	var sum float64
	for _, f := range []string{"used_cpu_user", "used_cpu_sys"} {
		v, err := strconv.ParseFloat(m[f], 64)
		if err != nil {
			b.Fatalf("INFO cpu %s: %v", f, err)
		}
		sum += v
	}
	return sum
}

// redisInfo returns the fields of an INFO section.
func redisInfo(b *testing.B, client *redis.Client, section string) map[string]string {
	text, err := client.Info(context.Background(), section).Result()
	if err != nil {
		b.Fatal(err)
	}
	m := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		if k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":"); ok {
			m[k] = v
		}
	}
	return m
}

// commandStat reads calls and usec from a commandstats value
// ("calls=3,usec=12,usec_per_call=4.00,...").
func commandStat(v string) (calls, usec float64) {
	for _, kv := range strings.Split(v, ",") {
		k, val, _ := strings.Cut(kv, "=")
		f, _ := strconv.ParseFloat(val, 64)
		switch k {
		case "calls":
			calls = f
		case "usec":
			usec = f
		}
	}
	return calls, usec
}
