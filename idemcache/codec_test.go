package idemcache

import (
	"bytes"
	"errors"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// fullRecord is a completed record with every field set.
func fullRecord() *idemstore.Record {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC)
	return &idemstore.Record{
		Identity:          idemstore.Identity{Scope: "tenant-é", Endpoint: "POST /v1/payments", Key: "k\x00ey"},
		Fingerprint:       fp1,
		State:             idemstore.StateCompleted,
		Token:             "token-1",
		LockedUntil:       t0.Add(30 * time.Second),
		StartedAt:         t0,
		LeaseExpiredState: idemstore.StateReleased,
		Response: &idemstore.Response{
			Status: 201,
			Header: http.Header{
				"Content-Type": {"application/json"},
				"Link":         {"</a>; rel=a", "</b>; rel=b"},
				"X-Empty":      {""},
			},
			Body: bytes.Repeat([]byte("0123456789"), 1000),
		},
		RecoveryPoint: "charged",
		Attempts:      3,
		CreatedAt:     t0.Add(-time.Hour),
		UpdatedAt:     t0.Add(2 * time.Second),
		ExpiresAt:     t0.Add(23 * time.Hour),
	}
}

func TestCodecRoundTrip(t *testing.T) {
	t.Parallel()
	notReplayable := fullRecord()
	notReplayable.Response = nil
	notReplayable.NotReplayable = true
	noHeader := fullRecord()
	noHeader.Response.Header = nil
	noHeader.Response.Body = nil
	zeroTimes := &idemstore.Record{Identity: testID, State: idemstore.StateCompleted}
	beforeEpoch := fullRecord()
	beforeEpoch.CreatedAt = time.Date(1960, 1, 1, 0, 0, 0, 999, time.UTC)
	for _, tt := range []struct {
		name string
		rec  *idemstore.Record
	}{
		{"Full", fullRecord()},
		{"NotReplayable", notReplayable},
		{"NoHeaderNoBody", noHeader},
		{"ZeroTimes", zeroTimes},
		{"BeforeEpoch", beforeEpoch},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			data := encodeRecord(nil, tt.rec)
			got, err := decodeRecord(data)
			if err != nil {
				t.Fatalf("decodeRecord: %v", err)
			}
			requireSameRecord(t, got, tt.rec)
			// The encoding is deterministic.
			if again := encodeRecord(nil, got); !bytes.Equal(again, data) {
				t.Fatalf("re-encoding the decoded record gives other bytes")
			}
		})
	}
}

func TestCodecCopies(t *testing.T) {
	t.Parallel()
	data := encodeRecord(nil, fullRecord())
	got, err := decodeRecord(data)
	if err != nil {
		t.Fatal(err)
	}
	for i := range data {
		data[i] = 0xff
	}
	requireSameRecord(t, got, fullRecord())
}

func TestCodecCorrupt(t *testing.T) {
	t.Parallel()
	data := encodeRecord(nil, fullRecord())
	// Every truncation fails cleanly.
	for n := range len(data) {
		if _, err := decodeRecord(data[:n]); !errors.Is(err, errCorrupt) {
			t.Fatalf("decoding %d of %d bytes: err = %v, want errCorrupt", n, len(data), err)
		}
	}
	if _, err := decodeRecord(append(data, 0)); !errors.Is(err, errCorrupt) {
		t.Fatalf("trailing byte: err = %v, want errCorrupt", err)
	}
	other := append([]byte{codecVersion + 1}, data[1:]...)
	if _, err := decodeRecord(other); !errors.Is(err, errCorrupt) {
		t.Fatalf("other version: err = %v, want errCorrupt", err)
	}
	// A huge count does not allocate before failing.
	huge := encodeRecord(nil, &idemstore.Record{State: idemstore.StateCompleted, Response: &idemstore.Response{Status: 200}})
	huge = huge[:len(huge)-2]                                           // drop the header count and body length
	huge = append(huge, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f) // a count of 2^55
	if _, err := decodeRecord(huge); !errors.Is(err, errCorrupt) {
		t.Fatalf("huge count: err = %v, want errCorrupt", err)
	}
}

func FuzzDecodeRecord(f *testing.F) {
	f.Add(encodeRecord(nil, fullRecord()))
	f.Add(encodeRecord(nil, &idemstore.Record{}))
	f.Add([]byte{})
	f.Add([]byte{codecVersion})
	f.Fuzz(func(t *testing.T, data []byte) {
		rec, err := decodeRecord(data)
		if err != nil {
			return
		}
		// What decodes re-encodes to the same bytes.
		if again := encodeRecord(nil, rec); !bytes.Equal(again, data) {
			// Non-canonical varints or unsorted header names decode
			// too; they must at least decode to the same record.
			rec2, err := decodeRecord(again)
			if err != nil {
				t.Fatalf("re-encoded record does not decode: %v", err)
			}
			requireSameRecord(t, rec2, rec)
		}
	})
}

// requireSameRecord fails unless got and want hold the same values; times
// are compared as instants.
func requireSameRecord(t *testing.T, got, want *idemstore.Record) {
	t.Helper()
	g, w := *got, *want
	for _, p := range []struct{ g, w *time.Time }{
		{&g.LockedUntil, &w.LockedUntil}, {&g.StartedAt, &w.StartedAt}, {&g.CreatedAt, &w.CreatedAt},
		{&g.UpdatedAt, &w.UpdatedAt}, {&g.ExpiresAt, &w.ExpiresAt},
	} {
		if !p.g.Equal(*p.w) {
			t.Fatalf("time %v, want %v", *p.g, *p.w)
		}
		*p.g, *p.w = time.Time{}, time.Time{}
	}
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("record\n got %+v\nwant %+v", g, w)
	}
}
