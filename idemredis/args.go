package idemredis

// The scripts' arguments. Each script has a builder here: a struct whose
// fields are the script's arguments by the names its ARGV comment gives
// them, and one method that lays out the keys and arguments in the
// script's order. Nothing else in the package knows a position.
//
// reserve.lua and complete.lua, the scripts of every new key, take the
// record's index member and channel from its key (member_of and channel_of
// of lua/lib.lua) rather than as arguments: each argument costs the server
// its parsing and its hashing into Lua.
//
// The scripts that Store.run sends get the whole command from their
// builder's call method (see newCall): one slice, allocated once at its
// final size, holding the record's names as keysOf boxed them and the
// response as encodeResponse boxed it, so that only the call's own values
// (times, token, ...) are boxed here, once. The scripts run on index
// candidates (sweep, reap, reconcile claim) get their keys and arguments
// from keysArgs, for Script.EvalSha in a pipeline.

// reserveArgs are reserve.lua's arguments.
type reserveArgs struct {
	// now and lockedUntil are decimal Unix microseconds, parts of record
	// (see newRecordValue).
	now         string
	record      string // the new record, as stored (newRecordValue)
	lockedUntil string
	redisTTL    int64 // milliseconds, for PX; 0 for none
	// expiryScore is the record's expires_at when the expiry index must
	// list it from the start, otherwise 0.
	expiryScore int64
	// allKeys sends the five keys rather than the first two (see
	// keysOfCall); so does an expiryScore.
	allKeys bool
}

// call leaves out redisTTL and expiryScore when they are 0, as a new key
// of the default lease (which expires into unknown) has them, and
// expiryScore when it is 0.
func (a reserveArgs) call(k *boxedKeys) []any {
	switch {
	case a.expiryScore != 0:
		return append(keysOfCall(k, 5, 5), a.now, a.record, a.lockedUntil, a.redisTTL, a.expiryScore)
	case a.redisTTL != 0:
		return append(keysOfCall(k, a.keys(), 4), a.now, a.record, a.lockedUntil, a.redisTTL)
	}
	return append(keysOfCall(k, a.keys(), 3), a.now, a.record, a.lockedUntil)
}

// keys is how many keys call sends.
func (a reserveArgs) keys() int {
	if a.allKeys {
		return 5
	}
	return 2
}

// completeArgs are complete.lua's arguments.
type completeArgs struct {
	now   int64
	token string
	// resp is the response, sent when proof is "" (the script reads it
	// from record otherwise).
	resp encodedResponse
	// proof is the head and token of the record as the reservation wrote
	// it, or "" when unknown; record is then what completing it writes
	// (completedValue), with its Redis TTL (milliseconds) and expiry index
	// score.
	proof, record string
	redisTTL      int64
	expiryScore   string
	// allKeys sends the five keys rather than the first three (see
	// keysOfCall).
	allKeys bool
}

func (a completeArgs) call(k *boxedKeys) []any {
	n := 3
	if a.allKeys {
		n = 5
	}
	if a.proof == "" {
		return append(keysOfCall(k, n, 6), a.now, a.token,
			a.resp.notReplayable, a.resp.status, a.resp.header, a.resp.body)
	}
	// now and the token are in the record and the proof.
	return append(keysOfCall(k, n, 5), a.proof, len(a.proof)-1, a.record, a.redisTTL, a.expiryScore)
}

// keysOfCall starts the command of reserve.lua or complete.lua, with room
// for its args arguments, with the first n of the record's five keys: all
// five, or the few a new key needs (the record and its lease index for a
// reservation, and its expiry index for a completion). A script that finds
// it needs the others (where a lease ran out, or a record leaves unknown)
// answers IDEM_ALL_KEYS before it writes anything, and the call is sent
// again with all five: Redis builds the KEYS table of a script one element
// at a time, resizing it at each power of two, and hashes every key into
// Lua, on every call.
func keysOfCall(k *boxedKeys, n int, args int) []any {
	switch n {
	case 2:
		return append(newCall(1+2+args), argKeys2, k.record, k.index)
	case 3:
		return append(newCall(1+3+args), argKeys3, k.record, k.index, k.expiry)
	}
	return append(newCall(1+5+args), argKeys5, k.record, k.index, k.expiry, k.unknown, k.reconcile)
}

// finishArgs are the arguments of release.lua and mark_unknown.lua (which
// take the five keys) and of delete.lua (which takes the first three).
type finishArgs struct {
	now   int64
	token string
}

func (a finishArgs) call(k *boxedKeys) []any {
	return append(newCall(1+5+4), argKeys5, k.record, k.index, k.expiry, k.unknown, k.reconcile,
		a.now, a.token, k.member, k.channel)
}

func (a finishArgs) deleteCall(k *boxedKeys) []any {
	return append(newCall(1+3+4), argKeys3, k.record, k.index, k.expiry,
		a.now, a.token, k.member, k.channel)
}

// renewArgs are renew.lua's arguments.
type renewArgs struct {
	now         int64
	token       string
	lockedUntil int64
}

func (a renewArgs) call(k *boxedKeys) []any {
	return append(newCall(1+3+4), argKeys3, k.record, k.index, k.expiry,
		a.now, a.token, a.lockedUntil, k.member)
}

// resolveArgs are resolve.lua's arguments.
type resolveArgs struct {
	now   int64
	token string
	to    string // the target state
	resp  encodedResponse
}

func (a resolveArgs) call(k *boxedKeys) []any {
	return append(newCall(1+5+9), argKeys5, k.record, k.index, k.expiry, k.unknown, k.reconcile,
		a.now, a.token, a.to,
		a.resp.notReplayable, a.resp.status, a.resp.header, a.resp.body,
		k.member, k.channel)
}

// resealArgs are reseal.lua's arguments.
type resealArgs struct {
	now   int64
	token string
	resp  encodedResponse // status, header and body
}

func (a resealArgs) call(k *boxedKeys) []any {
	return append(newCall(1+1+5), argKeys1, k.record,
		a.now, a.token, a.resp.status, a.resp.header, a.resp.body)
}

// purgeArgs are purge.lua's arguments.
type purgeArgs struct {
	now   int64
	token string // "" for any
	force bool
}

func (a purgeArgs) call(k *boxedKeys) []any {
	force := argFalse
	if a.force {
		force = argTrue
	}
	return append(newCall(1+5+5), argKeys5, k.record, k.index, k.expiry, k.unknown, k.reconcile,
		a.now, a.token, force, k.member, k.channel)
}

// reconcileFailArgs are reconcile_fail.lua's arguments.
type reconcileFailArgs struct {
	token          string
	errText        string // the error, truncated
	reconcileAfter int64
}

func (a reconcileFailArgs) call(k *boxedKeys) []any {
	return append(newCall(1+5+4), argKeys5, k.record, k.index, k.expiry, k.unknown, k.reconcile,
		a.token, a.errText, a.reconcileAfter, k.member)
}

// indexArgs are the arguments of sweep.lua and reap.lua.
type indexArgs struct {
	now string // decimal Unix microseconds
}

func (a indexArgs) keysArgs(k recordKeys) ([]string, []any) {
	return k.all(), []any{a.now, k.member, k.channel}
}

// waitArgs are wait.lua's arguments.
type waitArgs struct {
	now int64
}

func (a waitArgs) call(k *boxedKeys) []any {
	return append(newCall(1+1+1), argKeys1, k.record, a.now)
}

// claimArgs are reconcile_claim.lua's arguments.
type claimArgs struct {
	now, holdUntil string // decimal Unix microseconds
	grace          string // decimal microseconds
}

func (a claimArgs) keysArgs(k recordKeys) ([]string, []any) {
	return k.all(), []any{a.now, a.holdUntil, k.member, a.grace}
}
