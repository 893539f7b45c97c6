package idemredis

import "fmt"

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
	Now, Key, Token, LockedUntil, ExpiresAt, Member, Channel, Prune int
}

// CompletePositions are complete.lua's argument positions that the raw
// loop changes.
type CompletePositions struct {
	Now, Token, Member, Channel int
}

// markerKeys are names boxed as keysOf boxes them, each its own value.
var markerKeys = &boxedKeys{record: "record", index: "index", expiry: "expiry",
	unknown: "unknown", reconcile: "reconcile", member: "member", channel: "channel"}

func reserveArgv() ReservePositions {
	argv := argvOf(reserveArgs{
		now: 1, lockedUntil: 2, expiresAt: 3, redisTTL: 4, prune: 5, ttl: 6,
		scope: "scope", endpoint: "endpoint", key: "key", fingerprint: "fingerprint",
		token: "token", leaseExpiredState: "les",
	}.call(markerKeys))
	return ReservePositions{
		Now:         position(argv, int64(1)),
		Key:         position(argv, "key"),
		Token:       position(argv, "token"),
		LockedUntil: position(argv, int64(2)),
		ExpiresAt:   position(argv, int64(3)),
		Member:      position(argv, "member"),
		Channel:     position(argv, "channel"),
		Prune:       position(argv, int64(5)),
	}
}

func completeArgv() CompletePositions {
	argv := argvOf(completeArgs{now: 1, token: "token",
		resp: encodedResponse{notReplayable: "nr", status: "status", header: "header", body: "body"},
	}.call(markerKeys))
	return CompletePositions{
		Now:     position(argv, int64(1)),
		Token:   position(argv, "token"),
		Member:  position(argv, "member"),
		Channel: position(argv, "channel"),
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
