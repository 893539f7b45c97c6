package idemredis

import (
	"fmt"
	"strconv"
	"time"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/headerjson"
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

// stateArg is a lease-expired state as a script argument, boxed once.
func stateArg(st idemstore.State) any {
	switch st {
	case idemstore.StateUnknown:
		return argUnknown
	case idemstore.StateReleased:
		return argReleased
	}
	return string(st)
}

var (
	argUnknown, argReleased     any = string(idemstore.StateUnknown), string(idemstore.StateReleased)
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
	header, err := headerjson.Encode(r.Header)
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

// recordFields are a record hash's values, as strings, before decoding.
type recordFields struct {
	scope, endpoint, key, fingerprint, state, token string
	leaseExpiredState, notReplayable, recoveryPoint string
	lockedUntil, startedAt, createdAt, updatedAt    string
	expiresAt, attempts, status, header, body       string
	ttl, reconcileAfter, reconcileAttempts          string
	reconcileError                                  string
	hasStatus                                       bool
}

// set stores value as field k; unknown fields are ignored.
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
	}
}

// recordFromFlat decodes a field, value, ... list (HGETALL in a script).
func recordFromFlat(vals []any) (*idemstore.Record, error) {
	if len(vals) == 0 || len(vals)%2 != 0 {
		return nil, fmt.Errorf("decoding record: %d values", len(vals))
	}
	var f recordFields
	for i := 0; i < len(vals); i += 2 {
		k, ok1 := vals[i].(string)
		v, ok2 := vals[i+1].(string)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("decoding record: unexpected %T, %T", vals[i], vals[i+1])
		}
		f.set(k, v)
	}
	return f.record()
}

// recordFromMap decodes a record hash.
func recordFromMap(m map[string]string) (*idemstore.Record, error) {
	var f recordFields
	for k, v := range m {
		f.set(k, v)
	}
	return f.record()
}

// record decodes the fields.
func (f *recordFields) record() (*idemstore.Record, error) {
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
	if r.Attempts, err = strconv.Atoi(f.attempts); err != nil {
		return nil, fmt.Errorf("decoding record field attempts: %w", err)
	}
	// Records written before these fields existed have none of them.
	r.TTL = r.ExpiresAt.Sub(r.CreatedAt)
	if f.ttl != "" {
		ttl, err := strconv.ParseInt(f.ttl, 10, 64)
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
		if r.ReconcileAttempts, err = strconv.Atoi(f.reconcileAttempts); err != nil {
			return nil, fmt.Errorf("decoding record field reconcile_attempts: %w", err)
		}
	}
	r.ReconcileError = f.reconcileError
	if f.hasStatus && !r.NotReplayable {
		resp := &b.resp
		resp.Body = []byte(f.body)
		if resp.Status, err = strconv.Atoi(f.status); err != nil {
			return nil, fmt.Errorf("decoding record field status: %w", err)
		}
		if h := f.header; h != "" && h != "null" {
			if resp.Header, err = headerjson.Decode(h); err != nil {
				return nil, fmt.Errorf("decoding record field header: %w", err)
			}
		}
		r.Response = resp
	}
	return r, nil
}

func parseMicros(s string) (time.Time, error) {
	us, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, err
	}
	return time.UnixMicro(us), nil
}
