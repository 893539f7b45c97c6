package idemgrpc_test

import (
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-dev/idem"
)

// BenchmarkFingerprint compares the two fingerprints the package doc
// weighs: the deterministic protobuf encoding (what the interceptor
// uses) and protojson canonicalised with RFC 8785, on a dynamic message
// (the test service's) and on a generated one (google.protobuf.Struct).
func BenchmarkFingerprint(b *testing.B) {
	dyn := newRequest("acct-1", 500, "0196c1c3-7a4e-7c2a-9f00-3b1e2d4c5a6b")
	set(dyn, "sent_at", protoreflect.ValueOfString("2026-05-01T10:00:00Z"))
	labels := dyn.Mutable(requestDesc.Fields().ByName("labels")).Map()
	for _, k := range []string{"order", "customer", "channel", "campaign"} {
		labels.Set(protoreflect.ValueOfString(k).MapKey(), protoreflect.ValueOfString(k+"-value"))
	}
	gen, err := structpb.NewStruct(map[string]any{
		"request_id": "0196c1c3-7a4e-7c2a-9f00-3b1e2d4c5a6b", "account": "acct-1", "amount_cents": 500,
		"sent_at": "2026-05-01T10:00:00Z", "labels": map[string]any{"order": "o", "customer": "c", "channel": "ch", "campaign": "ca"},
	})
	if err != nil {
		b.Fatal(err)
	}
	for _, m := range []struct {
		name string
		req  proto.Message
	}{{"dynamic", dyn}, {"generated", gen}} {
		b.Run(m.name, func(b *testing.B) { benchFingerprint(b, m.req) })
	}
}

func benchFingerprint(b *testing.B, req proto.Message) {
	const method = "/idem.test.v1.Payments/CreatePayment"
	b.Run("deterministic", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(req)
			if err != nil {
				b.Fatal(err)
			}
			idem.FingerprintBytes(method, raw)
		}
	})
	b.Run("protojson_jcs", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			raw, err := protojson.Marshal(req)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := idem.FingerprintJSON(method, raw, idem.FingerprintConfig{}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
