package idemredis

import (
	"fmt"

	"github.com/idem-dev/idem/idemstore"
)

// ReserveArgv and CompleteArgv name the positions in ARGV (from 0) of the
// arguments of reserve.lua and complete.lua that the raw benchmark loop
// (bench_middleware_test.go) changes in the calls it recorded. They are
// read off the builders of args.go (a call built with distinct values,
// each then looked up), so they follow them.
var (
	ReserveArgv  = reserveArgv()
	CompleteArgv = completeArgv()
)

// ReservePositions are reserve.lua's argument positions that the raw loop
// changes.
type ReservePositions struct {
	Now, Record, LockedUntil int
}

// CompletePositions are complete.lua's argument positions that the raw
// loop changes.
type CompletePositions struct {
	Now, Token int
}

// markerKeys are names boxed as keysOf boxes them, each its own value.
var markerKeys = &boxedKeys{record: "record", index: "index", expiry: "expiry",
	unknown: "unknown", reconcile: "reconcile", member: "member", channel: "channel"}

func reserveArgv() ReservePositions {
	argv := argvOf(reserveArgs{now: 1, lockedUntil: 2, redisTTL: 3, record: "record"}.call(markerKeys))
	return ReservePositions{
		Now:         position(argv, int64(1)),
		Record:      position(argv, "record"),
		LockedUntil: position(argv, int64(2)),
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
		return newRecordValue(p, r.LeaseExpiredState, now, now+lease, now+ttl, ttl)
	}
}

func completeArgv() CompletePositions {
	argv := argvOf(completeArgs{now: 1, token: "token",
		resp: encodedResponse{notReplayable: "nr", status: "status", header: "header", body: "body"},
	}.call(markerKeys))
	return CompletePositions{
		Now:   position(argv, int64(1)),
		Token: position(argv, "token"),
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
