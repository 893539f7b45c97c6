package idemredis

import (
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// legacyRecordFromMap is recordFromMap as it was before the fields were
// decoded through recordFields: the reference for recordFromFlat and
// recordFromMap.
func legacyRecordFromMap(m map[string]string) (*idemstore.Record, error) {
	r := &idemstore.Record{
		Identity: idemstore.Identity{
			Scope:    m["scope"],
			Endpoint: m["endpoint"],
			Key:      m["key"],
		},
		Fingerprint:       m["fingerprint"],
		State:             idemstore.State(m["state"]),
		Token:             m["token"],
		LeaseExpiredState: idemstore.State(m["lease_expired_state"]),
		NotReplayable:     m["not_replayable"] == "1",
		RecoveryPoint:     m["recovery_point"],
	}
	if !r.State.Valid() {
		return nil, fmt.Errorf("decoding record: invalid state %q", r.State)
	}
	var err error
	times := []struct {
		field string
		dst   *time.Time
	}{
		{"locked_until", &r.LockedUntil},
		{"started_at", &r.StartedAt},
		{"created_at", &r.CreatedAt},
		{"updated_at", &r.UpdatedAt},
		{"expires_at", &r.ExpiresAt},
	}
	for _, f := range times {
		if *f.dst, err = parseMicros(m[f.field]); err != nil {
			return nil, fmt.Errorf("decoding record field %s: %w", f.field, err)
		}
	}
	if r.Attempts, err = strconv.Atoi(m["attempts"]); err != nil {
		return nil, fmt.Errorf("decoding record field attempts: %w", err)
	}
	if status, ok := m["status"]; ok && !r.NotReplayable {
		resp := &idemstore.Response{Body: []byte(m["body"])}
		if resp.Status, err = strconv.Atoi(status); err != nil {
			return nil, fmt.Errorf("decoding record field status: %w", err)
		}
		if h := m["header"]; h != "" && h != "null" {
			resp.Header = make(http.Header)
			if err := json.Unmarshal([]byte(h), &resp.Header); err != nil {
				return nil, fmt.Errorf("decoding record field header: %w", err)
			}
		}
		r.Response = resp
	}
	// A record without a ttl field (all of them, then) has the retention
	// it was made with.
	r.TTL = r.ExpiresAt.Sub(r.CreatedAt)
	return r, nil
}

// fullRecord is a completed record's hash as the scripts write it.
func fullRecord() []string {
	return []string{
		"scope", "tenant-a", "endpoint", "POST /v1/payments", "key", "key-1",
		"fingerprint", "fp", "state", "completed", "token", "t",
		"lease_expired_state", "unknown", "locked_until", "1764119000000000",
		"started_at", "1764118000000000", "created_at", "1764118000000001",
		"updated_at", "1764118000000002", "expires_at", "1764121600000000",
		"attempts", "1", "not_replayable", "0", "recovery_point", "rp",
		"status", "201", "header", `{"Content-Type":["application/json"],"Location":["/v1/payments/pay_123"]}`,
		"body", `{"id":"pay_123"}`,
	}
}

func flat(kv []string) []any {
	vals := make([]any, len(kv))
	for i, s := range kv {
		vals[i] = s
	}
	return vals
}

// with returns kv with field set to v (appended when absent).
func with(kv []string, field, v string) []string {
	kv = append([]string(nil), kv...)
	for i := 0; i < len(kv); i += 2 {
		if kv[i] == field {
			kv[i+1] = v
			return kv
		}
	}
	return append(kv, field, v)
}

// without returns kv without field.
func without(kv []string, field string) []string {
	var out []string
	for i := 0; i < len(kv); i += 2 {
		if kv[i] != field {
			out = append(out, kv[i], kv[i+1])
		}
	}
	return out
}

func decodeCases() map[string][]any {
	full := fullRecord()
	cases := map[string][]any{
		"full":             flat(full),
		"empty":            {},
		"odd":              flat(full[:3]),
		"non-string key":   append(flat(full), int64(1), "x"),
		"non-string value": append(flat(full), "x", int64(1)),
		"unknown field":    flat(with(full, "extra", "x")),
		"duplicate field":  flat(append(append([]string(nil), full...), "state", "released", "attempts", "7")),
		"not replayable":   flat(with(full, "not_replayable", "1")),
		"in progress":      flat(without(without(without(with(full, "state", "in_progress"), "status"), "header"), "body")),
		"empty status":     flat(with(full, "status", "")),
		"bad status":       flat(with(full, "status", "2x1")),
		"null header":      flat(with(full, "header", "null")),
		"empty header":     flat(with(full, "header", "")),
		"empty object":     flat(with(full, "header", "{}")),
		"bad header":       flat(with(full, "header", `{"a":"b"}`)),
		"no header":        flat(without(full, "header")),
		"no body":          flat(without(full, "body")),
		"bad state":        flat(with(full, "state", "done")),
		"no state":         flat(without(full, "state")),
		"bad attempts":     flat(with(full, "attempts", "x")),
		"no attempts":      flat(without(full, "attempts")),
		"negative time":    flat(with(full, "created_at", "-5")),
		"two bad times":    flat(with(with(full, "expires_at", "x"), "started_at", "y")),
	}
	for _, f := range []string{"locked_until", "started_at", "created_at", "updated_at", "expires_at"} {
		cases["bad "+f] = flat(with(full, f, "1.5"))
		cases["no "+f] = flat(without(full, f))
	}
	return cases
}

// checkDecode compares recordFromMap on vals (field, value, ...), a record
// hash of the earlier layout, with the legacy decoder.
func checkDecode(t *testing.T, vals []any) {
	t.Helper()
	if len(vals) == 0 || len(vals)%2 != 0 {
		return
	}
	m := make(map[string]string)
	for i := 0; i < len(vals); i += 2 {
		k, ok1 := vals[i].(string)
		v, ok2 := vals[i+1].(string)
		if !ok1 || !ok2 {
			return
		}
		m[k] = v
	}
	want, wantErr := legacyRecordFromMap(m)
	got, err := recordFromMap(m)
	if fmt.Sprint(err) != fmt.Sprint(wantErr) || !reflect.DeepEqual(got, want) {
		t.Fatalf("recordFromMap(%q) = %+v, %v; want %+v, %v", m, got, err, want, wantErr)
	}
}

func TestDecodeMatchesLegacy(t *testing.T) {
	for name, vals := range decodeCases() {
		t.Run(name, func(t *testing.T) { checkDecode(t, vals) })
	}
	// The full record must decode; a test whose cases all fail to decode
	// would compare nothing but errors.
	r, err := recordFromMap(hashOf(fullRecord()))
	if err != nil || r.Response == nil || r.Response.Status != 201 || r.Response.Header.Get("Location") != "/v1/payments/pay_123" {
		t.Fatalf("full record = %+v, %v", r, err)
	}
}

// FuzzDecode compares the decoders with the legacy one on a full record with
// one field replaced and another one dropped.
func FuzzDecode(f *testing.F) {
	f.Add(uint8(4), "completed", uint8(255))
	f.Add(uint8(12), "x", uint8(15))
	f.Add(uint8(15), `{"A":["b","c"]}`, uint8(13))
	f.Add(uint8(17), "", uint8(0))
	f.Fuzz(func(t *testing.T, field uint8, value string, drop uint8) {
		kv := fullRecord()
		if i := int(field); i < len(kv)/2 {
			kv[2*i+1] = value
		} else {
			kv = append(kv, value, value)
		}
		if i := int(drop); i < len(kv)/2 {
			kv = append(kv[:2*i:2*i], kv[2*i+2:]...)
		}
		checkDecode(t, flat(kv))
	})
}

// hashOf returns kv (field, value, ...) as a map.
func hashOf(kv []string) map[string]string {
	m := make(map[string]string, len(kv)/2)
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

func BenchmarkDecodeRecord(b *testing.B) {
	var f recordFields
	for k, v := range hashOf(fullRecord()) {
		f.set(k, v)
	}
	v := encodeFields(&f)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decodeRecord(v); err != nil {
			b.Fatal(err)
		}
	}
}
