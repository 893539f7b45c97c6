package chaos

import (
	"io"
	"net"
	"slices"
	"testing"
	"time"
)

var allKinds = []FaultKind{FaultKillProxy, FaultPauseProxy, FaultPartition, FaultLatency, FaultDrop, FaultReset,
	FaultStoreCrash, FaultFailover, FaultSlowUpstream, FaultClientLoss}

// TestScheduleReproducible: a seed is a schedule; another seed another.
func TestScheduleReproducible(t *testing.T) {
	t.Parallel()
	cfg := ScheduleConfig{Seed: 42, Duration: time.Minute, Kinds: allKinds, Proxies: 3, Pause: 5 * time.Second}
	a, b := Schedule(cfg), Schedule(cfg)
	if len(a) == 0 || !slices.Equal(a, b) {
		t.Fatalf("one seed, two schedules:\n%v\n%v", a, b)
	}
	cfg.Seed = 43
	if c := Schedule(cfg); slices.Equal(a, c) {
		t.Fatalf("seeds 42 and 43 drew the same schedule: %v", a)
	}
}

// TestScheduleRules: faults end in time, never overlap on one slot, a
// pause outlasts its minimum, a failover happens at most once, and every
// kind is drawn over a long schedule.
func TestScheduleRules(t *testing.T) {
	t.Parallel()
	for seed := range uint64(50) {
		cfg := ScheduleConfig{Seed: seed, Duration: 2 * time.Minute, Kinds: allKinds, Proxies: 3, Pause: 5 * time.Second}
		s := Schedule(cfg)
		busy := make(map[string]time.Duration)
		seen := make(map[FaultKind]int)
		for i, f := range s {
			seen[f.Kind]++
			if i > 0 && f.At < s[i-1].At {
				t.Fatalf("seed %d: %v before %v", seed, f, s[i-1])
			}
			if f.At+f.For > cfg.Duration {
				t.Fatalf("seed %d: %v ends after %v", seed, f, cfg.Duration)
			}
			if f.At < busy[f.slot()] {
				t.Fatalf("seed %d: %v overlaps another fault on %s", seed, f, f.slot())
			}
			busy[f.slot()] = f.At + f.For
			if f.Kind == FaultPauseProxy && f.For <= cfg.Pause {
				t.Fatalf("seed %d: %v is not longer than %v", seed, f, cfg.Pause)
			}
			if f.Kind.hitsProxy() && (f.Proxy < 0 || f.Proxy >= cfg.Proxies) {
				t.Fatalf("seed %d: %v hits no proxy", seed, f)
			}
		}
		if seen[FaultFailover] > 1 {
			t.Fatalf("seed %d: %d failovers", seed, seen[FaultFailover])
		}
		if seed == 0 {
			for _, k := range allKinds {
				if seen[k] == 0 && k != FaultFailover {
					t.Errorf("two minutes of faults without %s: %v", k, s)
				}
			}
		}
	}
}

// TestRelay: bytes pass in order, latency delays them, a blackhole holds
// them until it heals, and a reset ends the connection.
func TestRelay(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // an echo server
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	r, err := NewRelay(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	conn, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	echo := func(msg string) (string, time.Duration) {
		t.Helper()
		start := time.Now()
		if _, err := conn.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, len(msg))
		if _, err := io.ReadFull(conn, buf); err != nil {
			t.Fatalf("echo of %q: %v", msg, err)
		}
		return string(buf), time.Since(start)
	}
	if got, _ := echo("hello"); got != "hello" {
		t.Fatalf("echo: %q", got)
	}
	r.SetLatency(100 * time.Millisecond)
	if got, d := echo("slow"); got != "slow" || d < 200*time.Millisecond {
		t.Fatalf("with 100 ms each way: %q after %v", got, d)
	}
	r.SetLatency(0)
	r.Blackhole(true)
	healed := time.AfterFunc(300*time.Millisecond, func() { r.Blackhole(false) })
	defer healed.Stop()
	if got, d := echo("held"); got != "held" || d < 300*time.Millisecond {
		t.Fatalf("through a partition healed after 300 ms: %q after %v", got, d)
	}
	r.Reset()
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); err == nil {
		t.Fatal("a read after the reset succeeded")
	}
}
