package idemredis

import (
	"fmt"

	"github.com/idem-dev/idem/idemstore"
)

// ReserveArgv names the positions in ARGV (from 0) of the arguments of
// reserve.lua that the raw benchmark loop (bench_middleware_test.go)
// changes in the calls it recorded. They are read off the builder of
// args.go (a call built with distinct values, each then looked up), so they
// follow it.
var ReserveArgv = reserveArgv()

// ReservePositions are reserve.lua's argument positions that the raw loop
// changes.
type ReservePositions struct {
	Now, Record, LockedUntil int
}

// markerKeys are names boxed as keysOf boxes them, each its own value.
var markerKeys = &boxedKeys{record: "record", index: "index", expiry: "expiry",
	unknown: "unknown", reconcile: "reconcile", member: "member", channel: "channel"}

func reserveArgv() ReservePositions {
	argv := argvOf(reserveArgs{now: "now", lockedUntil: "lockedUntil", redisTTL: 3, record: "record"}.call(markerKeys))
	return ReservePositions{
		Now:         position(argv, "now"),
		Record:      position(argv, "record"),
		LockedUntil: position(argv, "lockedUntil"),
	}
}

// NewRecordBuilder returns a function that makes reserve.lua's record
// argument for key and token at now (Unix microseconds) with the store's
// builder (newRecordValue), the other fields and the lease and retention
// those of recorded, the record argument of a recorded call.
func NewRecordBuilder(recorded string) func(key, token string, now int64) string {
	r, err := decodeRecord(recorded)
	if err != nil {
		panic(err)
	}
	lease := r.LockedUntil.Sub(r.CreatedAt).Microseconds()
	ttl := r.TTL.Microseconds()
	return func(key, token string, now int64) string {
		p := &idemstore.ReserveParams{Identity: idemstore.Identity{Scope: r.Scope, Endpoint: r.Endpoint, Key: key},
			Fingerprint: r.Fingerprint, Token: token}
		v, _, _ := newRecordValue(p, r.LeaseExpiredState, now, now+lease, now+ttl, ttl)
		return v
	}
}

// NewCompleteBuilder returns a function that makes complete.lua's
// arguments as KeyComplete sends them for a record reserve.lua inserted
// (its record argument) and completes at now (Unix microseconds), with the
// response of recorded, the arguments of a recorded call that had the
// proof of its reservation.
func NewCompleteBuilder(recorded []any) func(reserved string, now int64) []any {
	r, err := decodeRecord(fmt.Sprint(recorded[2]))
	if err != nil {
		panic(err)
	}
	resp, err := encodeResponse(r.Response, r.NotReplayable)
	if err != nil {
		panic(err)
	}
	return func(reserved string, now int64) []any {
		f, err := decodeRecord(reserved)
		if err != nil {
			panic(err)
		}
		rec, proof, ttl, score, ok := completedValue(reserved, now, f.Token, resp)
		if !ok {
			panic("completedValue refused " + reserved)
		}
		a := completeArgs{now: now, token: f.Token, proof: proof, record: rec, redisTTL: ttl, expiryScore: score}
		return argvOf(a.call(markerKeys))
	}
}

// argvOf returns the arguments of a call made by a builder: what follows
// its keys.
func argvOf(call []any) []any {
	return call[3+call[2].(int):]
}

// position returns the index of the one element of argv equal to v.
func position(argv []any, v any) int {
	at := -1
	for i, a := range argv {
		if a == v {
			if at >= 0 {
				panic(fmt.Sprintf("%v is at %d and %d in %v", v, at, i, argv))
			}
			at = i
		}
	}
	if at < 0 {
		panic(fmt.Sprintf("%v is not in %v", v, argv))
	}
	return at
}
