package chaos

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// FaultKind names a fault the campaign injects.
type FaultKind string

// The faults. A proxy's link is its TCP relay to the store.
const (
	// FaultKillProxy SIGKILLs a proxy and starts it again after a while.
	FaultKillProxy FaultKind = "kill-proxy"
	// FaultPauseProxy SIGSTOPs a proxy for longer than the lease and the
	// reconciler's grace, then SIGCONTs it: the review's pause scenario.
	FaultPauseProxy FaultKind = "pause-proxy"
	// FaultPartition blackholes a proxy's link for a while.
	FaultPartition FaultKind = "partition"
	// FaultLatency adds latency to a proxy's link for a while.
	FaultLatency FaultKind = "latency"
	// FaultDrop closes every connection of a proxy's link.
	FaultDrop FaultKind = "drop"
	// FaultReset resets every connection of a proxy's link.
	FaultReset FaultKind = "reset"
	// FaultStoreCrash crashes the store (pg_ctl stop -m immediate, SIGKILL
	// of redis-server) and starts it again after a while.
	FaultStoreCrash FaultKind = "store-crash"
	// FaultFailover crashes the store's primary and promotes its replica.
	FaultFailover FaultKind = "failover"
	// FaultSlowUpstream slows every execution for a while.
	FaultSlowUpstream FaultKind = "slow-upstream"
	// FaultClientLoss makes the clients hang up on most requests for a
	// while: answers lost on the client's side.
	FaultClientLoss FaultKind = "client-loss"
)

// PlannedFault is one fault of a schedule.
type PlannedFault struct {
	// At is when it starts, from the start of the campaign.
	At   time.Duration
	Kind FaultKind
	// Proxy is the proxy it hits, for the faults of a proxy or its link.
	Proxy int
	// For is how long it lasts; 0 for the instant ones (drop, reset).
	For time.Duration
	// Amount is the latency added (latency, slow-upstream).
	Amount time.Duration
}

func (f PlannedFault) String() string {
	s := fmt.Sprintf("+%v %s", f.At.Round(time.Millisecond), f.Kind)
	if f.Kind.hitsProxy() {
		s += fmt.Sprintf(" proxy %d", f.Proxy)
	}
	if f.For > 0 {
		s += fmt.Sprintf(" for %v", f.For.Round(time.Millisecond))
	}
	if f.Amount > 0 {
		s += fmt.Sprintf(" by %v", f.Amount.Round(time.Millisecond))
	}
	return s
}

// hitsProxy reports whether the fault hits one proxy or its link.
func (k FaultKind) hitsProxy() bool {
	switch k {
	case FaultKillProxy, FaultPauseProxy, FaultPartition, FaultLatency, FaultDrop, FaultReset:
		return true
	}
	return false
}

// slot is what a fault occupies: two faults on one slot never overlap.
func (f PlannedFault) slot() string {
	switch f.Kind {
	case FaultKillProxy, FaultPauseProxy:
		return fmt.Sprintf("proxy-%d", f.Proxy)
	case FaultPartition, FaultLatency, FaultDrop, FaultReset:
		return fmt.Sprintf("link-%d", f.Proxy)
	case FaultStoreCrash, FaultFailover:
		return "store"
	}
	return string(f.Kind)
}

// ScheduleConfig is the input of Schedule.
type ScheduleConfig struct {
	Seed uint64
	// Duration is the span the faults start in; each ends by Duration.
	Duration time.Duration
	// Kinds are the faults to draw from (uniformly).
	Kinds   []FaultKind
	Proxies int
	// Pause is how long FaultPauseProxy stops a proxy at least: longer
	// than the lease, the reconciler's grace and interval.
	Pause time.Duration
	// MeanGap is the mean time between two fault starts. Defaults to 1.5 s.
	MeanGap time.Duration
}

// Schedule draws a fault schedule from the seed: the same configuration
// gives the same schedule. Faults may overlap, except on one slot (a
// process, a link, the store); a failover happens at most once.
func Schedule(cfg ScheduleConfig) []PlannedFault {
	if cfg.MeanGap <= 0 {
		cfg.MeanGap = 1500 * time.Millisecond
	}
	if len(cfg.Kinds) == 0 || cfg.Proxies == 0 {
		return nil
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0xfa17))
	between := func(lo, hi time.Duration) time.Duration {
		return lo + time.Duration(rng.Int64N(int64(hi-lo)+1))
	}
	busy := make(map[string]time.Duration) // slot -> free from
	failedOver := false
	var out []PlannedFault
	at := between(300*time.Millisecond, cfg.MeanGap)
	for at < cfg.Duration {
		f := PlannedFault{At: at, Kind: cfg.Kinds[rng.IntN(len(cfg.Kinds))], Proxy: rng.IntN(cfg.Proxies)}
		switch f.Kind {
		case FaultKillProxy:
			f.For = between(300*time.Millisecond, 2*time.Second)
		case FaultPauseProxy:
			f.For = cfg.Pause + between(500*time.Millisecond, 2500*time.Millisecond)
		case FaultPartition:
			f.For = between(time.Second, 4*time.Second)
		case FaultLatency:
			f.For, f.Amount = between(2*time.Second, 5*time.Second), between(50*time.Millisecond, 400*time.Millisecond)
		case FaultStoreCrash:
			f.For = between(500*time.Millisecond, 3*time.Second)
		case FaultFailover:
			f.For = between(500*time.Millisecond, 2*time.Second) // until the replica is promoted
		case FaultSlowUpstream:
			f.For, f.Amount = between(2*time.Second, 5*time.Second), between(300*time.Millisecond, 1500*time.Millisecond)
		case FaultClientLoss:
			f.For = between(time.Second, 3*time.Second)
		}
		ok := at+f.For <= cfg.Duration && busy[f.slot()] <= at && !(f.Kind == FaultFailover && failedOver)
		if ok {
			busy[f.slot()] = at + f.For + 200*time.Millisecond
			failedOver = failedOver || f.Kind == FaultFailover
			out = append(out, f)
		}
		at += between(cfg.MeanGap/5, 2*cfg.MeanGap)
	}
	return out
}
