package idemredis

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/headerjson"
	"github.com/idem-dev/idem/internal/neverstored"
)

// micros formats t as decimal Unix microseconds, the scripts' time unit.
func micros(t time.Time) string {
	return strconv.FormatInt(t.UnixMicro(), 10)
}

// us is t in Unix microseconds as a script argument: go-redis sends an
// int64 in decimal, as micros spells it, without the string.
func us(t time.Time) int64 {
	return t.UnixMicro()
}

// encodedResponse is a response as the scripts take it. The fields are
// script arguments, boxed once here: the flag and the status from tables of
// interface values that need no allocation.
type encodedResponse struct {
	notReplayable any // "1" or "0"
	status        any // decimal, or "" when not replayable
	header        any // JSON of http.Header, []byte or ""
	body          any // []byte or ""
}

var (
	argTrue, argFalse, argEmpty any = "1", "0", ""
	// statusArgs are the statuses net/http lets a handler write.
	statusArgs = func() (t [1000]any) {
		for i := range t {
			t[i] = strconv.Itoa(i)
		}
		return t
	}()
)

func encodeResponse(r *idemstore.Response, notReplayable bool) (encodedResponse, error) {
	if notReplayable || r == nil {
		return encodedResponse{notReplayable: argTrue, status: argEmpty, header: argEmpty, body: argEmpty}, nil
	}
	header, err := headerjson.Encode(neverstored.Pack(r.Header, r.Sealed))
	if err != nil {
		return encodedResponse{}, fmt.Errorf("encoding header: %w", err)
	}
	var status any
	if r.Status >= 0 && r.Status < len(statusArgs) {
		status = statusArgs[r.Status]
	} else {
		status = strconv.Itoa(r.Status)
	}
	return encodedResponse{notReplayable: argFalse, status: status, header: header, body: r.Body}, nil
}

// A record is stored as one string (see lua/lib.lua, whose decode and encode
// mirror parse and encodeFields here):
//
//	2,state,lease_expired_state,locked_until,expires_at,ttl,created_at,
//	started_at,updated_at,attempts,reconcile_after,reconcile_attempts,
//	waiters,not_replayable,status,#token,#fingerprint,#scope,#endpoint,#key,
//	#recovery_point,#reconcile_error,#header;token fingerprint scope endpoint
//	key recovery_point reconcile_error header body
//
// without the line breaks and spaces: a head of comma-separated fields, the
// first the layout's version, that holds what the scripts decide on (states,
// times, numbers: no commas in them) and the lengths (#, in bytes) of the
// variable fields, which follow it one after the other, the body last. The
// scripts read and write a record with one GET and one SET, and decode it
// with one pattern match and a few substrings; Go slices the variable fields
// out of the reply without copying them. waiters counts the KeyWait calls
// registered since the record last changed (see wait.lua).
//
// Records of the earlier layout, a hash of the same fields by name, are
// read through set and rewritten in this form by their next write.

// recordFields are a record's values, as strings, before decoding.
type recordFields struct {
	scope, endpoint, key, fingerprint, state, token string
	leaseExpiredState, notReplayable, recoveryPoint string
	lockedUntil, startedAt, createdAt, updatedAt    string
	expiresAt, attempts, status, header, body       string
	ttl, reconcileAfter, reconcileAttempts          string
	reconcileError, waiters                         string
	hasStatus                                       bool
}

// errCorrupt is returned for a stored record that is not in the layout.
var errCorrupt = errors.New("decoding record: not a record")

// errShort is returned by parsePrefix when the prefix ends before the key.
var errShort = errors.New("decoding record: prefix too short")

// parse reads the stored record v into f. The strings of f are slices of v.
func (f *recordFields) parse(v string) error {
	return f.parseUpTo(v, false)
}

// parsePrefix reads the head and the identity of a record from v, a prefix
// of the stored record (GETRANGE), into f, or returns errShort.
func (f *recordFields) parsePrefix(v string) error {
	err := f.parseUpTo(v, true)
	if err == errCorrupt && !strings.Contains(v, ";") {
		return errShort
	}
	return err
}

func (f *recordFields) parseUpTo(v string, prefix bool) error {
	head, rest, ok := strings.Cut(v, ";")
	if !ok {
		return errCorrupt
	}
	var h [23]string
	for i := range len(h) - 1 {
		j := strings.IndexByte(head, ',')
		if j < 0 {
			return errCorrupt
		}
		h[i], head = head[:j], head[j+1:]
	}
	h[len(h)-1] = head
	if h[0] != "2" {
		return fmt.Errorf("decoding record: layout version %q", h[0])
	}
	f.state, f.leaseExpiredState, f.lockedUntil, f.expiresAt, f.ttl = h[1], h[2], h[3], h[4], h[5]
	f.createdAt, f.startedAt, f.updatedAt, f.attempts = h[6], h[7], h[8], h[9]
	f.reconcileAfter, f.reconcileAttempts, f.waiters = h[10], h[11], h[12]
	f.notReplayable, f.status, f.hasStatus = h[13], h[14], h[14] != ""
	for i, dst := range [...]*string{&f.token, &f.fingerprint, &f.scope, &f.endpoint,
		&f.key, &f.recoveryPoint, &f.reconcileError, &f.header} {
		n, err := atoi(h[15+i])
		if err != nil || n < 0 {
			return errCorrupt
		}
		if n > len(rest) {
			switch {
			case !prefix:
				return errCorrupt
			case i <= 4: // token, fingerprint, scope, endpoint, key
				return errShort
			}
			return nil // the identity is whole
		}
		*dst, rest = rest[:n], rest[n:]
	}
	if !prefix {
		f.body = rest
	}
	return nil
}

// encodeFields returns f as stored. A field of f left empty that the
// layout needs (a number) is written as its zero.
func encodeFields(f *recordFields) string {
	return encodeWith(f, -1, nil, nil)
}

// encodeWith is encodeFields with header and body appended to f's
// (completedValue passes the response's bytes, copied once, here), and
// updatedAt (Unix microseconds) for f's updated_at unless it is negative.
func encodeWith(f *recordFields, updatedAt int64, header, body []byte) string {
	zero := func(s string) string {
		if s == "" {
			return "0"
		}
		return s
	}
	var b strings.Builder
	b.Grow(256 + len(f.token) + len(f.fingerprint) + len(f.scope) + len(f.endpoint) + len(f.key) +
		len(f.recoveryPoint) + len(f.reconcileError) + len(f.header) + len(f.body) + len(header) + len(body))
	var num [20]byte
	b.WriteString("2")
	for i, v := range [...]string{f.state, f.leaseExpiredState, f.lockedUntil, f.expiresAt,
		f.ttl, f.createdAt, f.startedAt, f.updatedAt, zero(f.attempts),
		zero(f.reconcileAfter), zero(f.reconcileAttempts), zero(f.waiters),
		zero(f.notReplayable), f.status} {
		b.WriteByte(',')
		if i == 7 && updatedAt >= 0 {
			b.Write(strconv.AppendInt(num[:0], updatedAt, 10))
			continue
		}
		b.WriteString(v)
	}
	variable := [...]string{f.token, f.fingerprint, f.scope, f.endpoint, f.key,
		f.recoveryPoint, f.reconcileError}
	for _, v := range variable {
		b.WriteByte(',')
		b.Write(strconv.AppendInt(num[:0], int64(len(v)), 10))
	}
	b.WriteByte(',')
	b.Write(strconv.AppendInt(num[:0], int64(len(f.header)+len(header)), 10))
	b.WriteByte(';')
	for _, v := range variable {
		b.WriteString(v)
	}
	b.WriteString(f.header)
	b.Write(header)
	b.WriteString(f.body)
	b.Write(body)
	return b.String()
}

// newRecordValue returns, as stored, the in_progress record that a
// reservation of p inserts at now (newRecord decodes it): encodeFields of
// it, written in one allocation. Its digits of now and lockedUntil, parts
// of it, are reserve.lua's arguments of the same times: formatted once
// (16 digits take a few hundred instructions), not again by go-redis.
func newRecordValue(p *idemstore.ReserveParams, les idemstore.State, now, lockedUntil, expiresAt, ttl int64) (v, nowDigits, lockedUntilDigits string) {
	var b strings.Builder
	b.Grow(200 + len(p.Token) + len(p.Fingerprint) + len(p.Scope) + len(p.Endpoint) + len(p.Key))
	var num, nowNum [20]byte
	writeInt := func(n int64) {
		b.WriteByte(',')
		b.Write(strconv.AppendInt(num[:0], n, 10))
	}
	b.WriteString("2,in_progress,")
	b.WriteString(string(les))
	lockedAt := b.Len() + 1
	writeInt(lockedUntil)
	lockedEnd := b.Len()
	writeInt(expiresAt)
	writeInt(ttl)
	nowAt := b.Len() + 1
	digits := strconv.AppendInt(nowNum[:0], now, 10)
	for range 3 { // created_at, started_at, updated_at
		b.WriteByte(',')
		b.Write(digits)
	}
	// attempts, reconcile_after, reconcile_attempts, waiters, not_replayable,
	// status (none)
	b.WriteString(",1,0,0,0,0,")
	for _, v := range [...]string{p.Token, p.Fingerprint, p.Scope, p.Endpoint, p.Key} {
		writeInt(int64(len(v)))
	}
	// recovery_point, reconcile_error, header: empty
	b.WriteString(",0,0,0;")
	for _, v := range [...]string{p.Token, p.Fingerprint, p.Scope, p.Endpoint, p.Key} {
		b.WriteString(v)
	}
	v = b.String()
	return v, v[nowAt : nowAt+len(digits)], v[lockedAt:lockedEnd]
}

// completedValue returns, as stored, the record that complete.lua would
// write at now (Unix microseconds) for token and resp when it finds the
// record v, with the Redis TTL (milliseconds) and expiry index score it
// would give it, and the proof the script looks for: v's head and token, the
// start of v (a slice of it). ok is false when v is not such a record: not
// in_progress with token and no waiters, its lease ended, or past its
// retention; the script then decides from the record it finds.
func completedValue(v string, now int64, token string, resp encodedResponse) (rec, proof string, ttl int64, expiresAt string, ok bool) {
	var f recordFields
	if f.parse(v) != nil || f.state != string(idemstore.StateInProgress) || f.token != token || f.waiters != "0" {
		return "", "", 0, "", false
	}
	lockedUntil, err1 := parseInt(f.lockedUntil)
	exp, err2 := parseInt(f.expiresAt)
	if err1 != nil || err2 != nil || now >= lockedUntil || now > exp {
		return "", "", 0, "", false
	}
	// The token follows the head and its ';'.
	proof = v[:strings.IndexByte(v, ';')+1+len(f.token)]
	f.state, f.updatedAt = string(idemstore.StateCompleted), ""
	f.header, f.body = "", ""
	var header, body []byte
	if resp.notReplayable == argTrue {
		f.notReplayable, f.status = "1", ""
	} else {
		f.status, _ = resp.status.(string)
		header, body = argBytes(resp.header), argBytes(resp.body)
	}
	// As settled in lua/lib.lua: the remaining retention plus the slack.
	ttl = (exp-now)/1000 + ttlSlack.Milliseconds()
	return encodeWith(&f, now, header, body), proof, ttl, f.expiresAt, true
}

// argBytes returns a script argument of encodedResponse ([]byte or "") as
// bytes.
func argBytes(v any) []byte {
	b, _ := v.([]byte)
	return b
}

// decodeRecord decodes a stored record.
func decodeRecord(v string) (*idemstore.Record, error) {
	return decodeShared(v, nil)
}

// decodeShared decodes a stored record whose response header the caller
// does not change and may share (see idemstore.ReserveResult), from
// headers; a nil headers decodes a header of the caller's own.
func decodeShared(v string, headers *headerjson.Cache) (*idemstore.Record, error) {
	var f recordFields
	if err := f.parse(v); err != nil {
		return nil, err
	}
	return f.record(headers)
}

// set stores value as field k of a record of the earlier layout (a hash);
// unknown fields are ignored.
func (f *recordFields) set(k, v string) {
	switch k {
	case "scope":
		f.scope = v
	case "endpoint":
		f.endpoint = v
	case "key":
		f.key = v
	case "fingerprint":
		f.fingerprint = v
	case "state":
		f.state = v
	case "token":
		f.token = v
	case "lease_expired_state":
		f.leaseExpiredState = v
	case "not_replayable":
		f.notReplayable = v
	case "recovery_point":
		f.recoveryPoint = v
	case "locked_until":
		f.lockedUntil = v
	case "started_at":
		f.startedAt = v
	case "created_at":
		f.createdAt = v
	case "updated_at":
		f.updatedAt = v
	case "expires_at":
		f.expiresAt = v
	case "attempts":
		f.attempts = v
	case "status":
		f.status, f.hasStatus = v, true
	case "header":
		f.header = v
	case "body":
		f.body = v
	case "ttl":
		f.ttl = v
	case "reconcile_after":
		f.reconcileAfter = v
	case "reconcile_attempts":
		f.reconcileAttempts = v
	case "reconcile_error":
		f.reconcileError = v
	case "waiters":
		f.waiters = v
	}
}

// recordFromMap decodes a record of the earlier layout, a hash.
func recordFromMap(m map[string]string) (*idemstore.Record, error) {
	var f recordFields
	for k, v := range m {
		f.set(k, v)
	}
	return f.record(nil)
}

// record decodes the fields, the response header from headers when it is
// not nil (a header the caller may share: see decodeShared).
func (f *recordFields) record(headers *headerjson.Cache) (*idemstore.Record, error) {
	// One allocation for the record and its response.
	b := &struct {
		rec  idemstore.Record
		resp idemstore.Response
	}{}
	r := &b.rec
	*r = idemstore.Record{
		Identity: idemstore.Identity{
			Scope:    f.scope,
			Endpoint: f.endpoint,
			Key:      f.key,
		},
		Fingerprint:       f.fingerprint,
		State:             idemstore.State(f.state),
		Token:             f.token,
		LeaseExpiredState: idemstore.State(f.leaseExpiredState),
		NotReplayable:     f.notReplayable == "1",
		RecoveryPoint:     f.recoveryPoint,
	}
	if !r.State.Valid() {
		return nil, fmt.Errorf("decoding record: invalid state %q", r.State)
	}
	var err error
	times := [...]struct {
		field string
		value string
		dst   *time.Time
	}{
		{"locked_until", f.lockedUntil, &r.LockedUntil},
		{"started_at", f.startedAt, &r.StartedAt},
		{"created_at", f.createdAt, &r.CreatedAt},
		{"updated_at", f.updatedAt, &r.UpdatedAt},
		{"expires_at", f.expiresAt, &r.ExpiresAt},
	}
	for _, t := range times {
		if *t.dst, err = parseMicros(t.value); err != nil {
			return nil, fmt.Errorf("decoding record field %s: %w", t.field, err)
		}
	}
	if r.Attempts, err = atoi(f.attempts); err != nil {
		return nil, fmt.Errorf("decoding record field attempts: %w", err)
	}
	// Records written before these fields existed have none of them.
	r.TTL = r.ExpiresAt.Sub(r.CreatedAt)
	if f.ttl != "" {
		ttl, err := parseInt(f.ttl)
		if err != nil {
			return nil, fmt.Errorf("decoding record field ttl: %w", err)
		}
		r.TTL = time.Duration(ttl) * time.Microsecond
	}
	if f.reconcileAfter != "" && f.reconcileAfter != "0" {
		if r.ReconcileAfter, err = parseMicros(f.reconcileAfter); err != nil {
			return nil, fmt.Errorf("decoding record field reconcile_after: %w", err)
		}
	}
	if f.reconcileAttempts != "" {
		if r.ReconcileAttempts, err = atoi(f.reconcileAttempts); err != nil {
			return nil, fmt.Errorf("decoding record field reconcile_attempts: %w", err)
		}
	}
	r.ReconcileError = f.reconcileError
	if f.hasStatus && !r.NotReplayable {
		resp := &b.resp
		resp.Body = []byte(f.body)
		if resp.Status, err = atoi(f.status); err != nil {
			return nil, fmt.Errorf("decoding record field status: %w", err)
		}
		if h := f.header; h != "" && h != "null" {
			decode := headerjson.Decode
			if headers != nil {
				decode = headers.Decode
			}
			if resp.Header, err = decode(h); err != nil {
				return nil, fmt.Errorf("decoding record field header: %w", err)
			}
			resp.Header, resp.Sealed = neverstored.Unpack(resp.Header)
		}
		r.Response = resp
	}
	return r, nil
}

func parseMicros(s string) (time.Time, error) {
	us, err := parseInt(s)
	if err != nil {
		return time.Time{}, err
	}
	return time.UnixMicro(us), nil
}

// parseInt is strconv.ParseInt(s, 10, 64), errors included, at a quarter
// of the cost for the numbers a record holds: a replay decodes a dozen,
// times of 16 digits most of them. It parses up to 18 digits with an
// optional '-' itself (no such number overflows) and hands anything else
// to strconv.
func parseInt(s string) (int64, error) {
	if v, ok := parseDigits(s); ok {
		return v, nil
	}
	return strconv.ParseInt(s, 10, 64)
}

// atoi is strconv.Atoi(s), as parseInt is strconv.ParseInt.
func atoi(s string) (int, error) {
	if v, ok := parseDigits(s); ok && int64(int(v)) == v {
		return int(v), nil
	}
	return strconv.Atoi(s)
}

// parseDigits parses s, 1 to 18 decimal digits after an optional '-', or
// reports false.
func parseDigits(s string) (int64, bool) {
	neg := s != "" && s[0] == '-'
	if neg {
		s = s[1:]
	}
	if s == "" || len(s) > 18 {
		return 0, false
	}
	var v int64
	for i := 0; i < len(s); i++ {
		d := s[i] - '0'
		if d > 9 {
			return 0, false
		}
		v = v*10 + int64(d)
	}
	if neg {
		v = -v
	}
	return v, true
}

// replayable reports whether f, a stored record, is one reserve.lua
// answers as it is stored at now (Unix microseconds): one its DONE pattern
// matches (lua/lib.lua: completed, then a lease_expired_state of lowercase
// letters and '_' and a locked_until of digits and '-') with an
// expires_at of at least now. Anything else, a number Lua would read
// differently included, is for reserve.lua to decide.
func (f *recordFields) replayable(now int64) bool {
	if f.state != string(idemstore.StateCompleted) ||
		!all(f.leaseExpiredState, isLowerOrUnderscore) || !all(f.lockedUntil, isDigitOrMinus) {
		return false
	}
	expiresAt, ok := parseDigits(f.expiresAt)
	return ok && expiresAt >= now
}

// all reports whether every byte of s is in class.
func all(s string, class func(byte) bool) bool {
	for i := 0; i < len(s); i++ {
		if !class(s[i]) {
			return false
		}
	}
	return true
}

func isLowerOrUnderscore(c byte) bool { return 'a' <= c && c <= 'z' || c == '_' }

func isDigitOrMinus(c byte) bool { return '0' <= c && c <= '9' || c == '-' }
