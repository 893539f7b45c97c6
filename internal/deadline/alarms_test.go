package deadline

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemtest"
)

// recorder is an Owner that records the generations it was called back with.
type recorder struct {
	mu   sync.Mutex
	gens []uint64
}

func (r *recorder) Alarmed(gen uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gens = append(r.gens, gen)
}

func (r *recorder) calls() []uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]uint64(nil), r.gens...)
}

// TestAlarms sets alarms on every shard, later ones due earlier than the
// timer of their shard is set to (which resets it), and moves the clock
// past them one second at a time: each fires exactly once, with its
// generation, in the Advance that reaches its due time and not before; a
// cancelled one never fires; Cancel reports whether the alarm was listed.
func TestAlarms(t *testing.T) {
	t.Parallel()
	clock := newClock()
	alarms := NewAlarms(clock)
	const n = 3 * alarmShardCount
	owners := make([]recorder, n)
	list := make([]Alarm, n)
	start := clock.Now()
	due := func(i int) time.Duration { return time.Duration(n-i) * time.Second } // later alarms are due earlier
	for i := range list {
		alarms.Set(&list[i], &owners[i], start.Add(due(i)), uint64(i))
	}
	if alarms.Cancel(new(Alarm)) {
		t.Fatal("Cancel of an alarm never set reported true")
	}
	const cancelled = 7
	if !alarms.Cancel(&list[cancelled]) || alarms.Cancel(&list[cancelled]) {
		t.Fatal("Cancel of a listed alarm: want true, then false")
	}
	for s := 0; s <= n; s++ {
		elapsed := time.Duration(s) * time.Second
		for i := range owners {
			calls := owners[i].calls()
			want := i != cancelled && due(i) <= elapsed
			switch {
			case want && (len(calls) != 1 || calls[0] != uint64(i)):
				t.Fatalf("after %v: alarm %d due %v called back %v, want once with %d", elapsed, i, due(i), calls, i)
			case !want && len(calls) != 0:
				t.Fatalf("after %v: alarm %d due %v (cancelled %v) called back %v", elapsed, i, due(i), i == cancelled, calls)
			}
		}
		clock.Advance(time.Second)
	}
	if alarms.Cancel(&list[0]) {
		t.Fatal("Cancel of a fired alarm reported true")
	}
	requireEmpty(t, alarms)

	// A fired alarm can be set again.
	alarms.Set(&list[0], &owners[0], clock.Now().Add(time.Second), 99)
	clock.Advance(time.Second)
	if calls := owners[0].calls(); len(calls) != 2 || calls[1] != 99 {
		t.Fatalf("alarm set again: called back %v", calls)
	}
}

// TestAlarmsConcurrent sets and cancels alarms from many goroutines while
// the clock moves (run with -race): every alarm left set fires exactly once,
// and the list ends empty.
func TestAlarmsConcurrent(t *testing.T) {
	t.Parallel()
	clock := newClock()
	alarms := NewAlarms(clock)
	const n = 400
	owners := make([]recorder, n)
	list := make([]Alarm, n)
	var wg sync.WaitGroup
	for i := range list {
		wg.Go(func() {
			alarms.Set(&list[i], &owners[i], clock.Now().Add(time.Duration(1+i%5)*time.Second), 1)
			if i%3 == 0 {
				alarms.Cancel(&list[i])
			}
		})
	}
	wg.Go(func() {
		for range 3 {
			clock.Advance(time.Second)
		}
	})
	wg.Wait()
	clock.Advance(time.Minute) // past every due time
	// A list armed while the clock moved past its due time, during the
	// Sets, fires in a goroutine of its own (the test clock's AfterFunc
	// with d <= 0, as the wall clock's): it may call back after Advance
	// returned. Wait for every alarm that was not cancelled.
	for deadline := time.Now().Add(10 * time.Second); ; {
		missing := -1
		for i := range owners {
			if i%3 != 0 && len(owners[i].calls()) == 0 {
				missing = i
				break
			}
		}
		if missing < 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("alarm %d not called back 10s after the clock passed its due time", missing)
		}
		time.Sleep(time.Millisecond)
	}
	for i := range owners {
		got, want := len(owners[i].calls()), 1
		if i%3 == 0 && got == 0 {
			continue // cancelled before it fired
		}
		if got != want {
			t.Fatalf("alarm %d called back %d times", i, got)
		}
	}
	requireEmpty(t, alarms)
}

// jumpingClock is a test clock that another goroutine moves by jump while
// the first timer is armed: after the alarm list has read the clock and
// before the timer is set.
type jumpingClock struct {
	*idemtest.Clock
	jump  time.Duration
	once  sync.Once
	moved chan struct{} // closed when that move has returned
}

func (c *jumpingClock) AfterFunc(d time.Duration, f func()) func() bool {
	c.once.Do(func() {
		before := c.Now()
		go func() {
			c.Advance(c.jump)
			close(c.moved)
		}()
		for c.Now().Equal(before) {
			runtime.Gosched()
		}
	})
	return c.Clock.AfterFunc(d, f)
}

// ownerChan is an Owner that sends the generation it is called back with.
type ownerChan chan uint64

func (o ownerChan) Alarmed(gen uint64) { o <- gen }

// TestAlarmsClockJumpsWhileArming moves a test clock to an alarm's due time
// from another goroutine while the list arms its timer for that alarm: the
// alarm fires on that move, not one move late. (Before the list re-armed on
// a jump, the timer was set a second late and the alarm waited for the next
// Advance: TestLeaseRenewedWhileHandlerRuns failed about once in a thousand
// runs with "renewal N did not come".)
func TestAlarmsClockJumpsWhileArming(t *testing.T) {
	t.Parallel()
	clock := &jumpingClock{Clock: newClock(), jump: time.Second, moved: make(chan struct{})}
	alarms := NewAlarms(clock)
	var a Alarm
	fired := make(ownerChan, 1)
	alarms.Set(&a, fired, clock.Now().Add(time.Second), 7)
	<-clock.moved
	select {
	case gen := <-fired:
		if gen != 7 {
			t.Fatalf("called back with generation %d, want 7", gen)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the alarm due when the clock moved did not fire")
	}
	requireEmpty(t, alarms)
}

// BenchmarkCtx measures a store call's context on the wall clock as the
// middleware uses it: arm, the store's Done (which sets the alarm), disarm
// (which cancels it), from parallel goroutines.
func BenchmarkCtx(b *testing.B) {
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		var c Ctx
		for pb.Next() {
			_ = c.Arm(Wall, context.Background(), 2*time.Second).Done()
			c.Disarm()
		}
	})
}
