package idemgrpc_test

import (
	"context"
	"io"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/idem-dev/idem/idemgrpc"
	"github.com/idem-dev/idem/idemmem"
)

// stream opens methodImport with key (when not empty) in the metadata,
// sends one request, closes its side and returns the first answer's error
// (nil when a payment came back).
func stream(ctx context.Context, conn *grpc.ClientConn, key string) error {
	if key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, key)
	}
	st, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, methodImport)
	if err != nil {
		return err
	}
	if err := st.SendMsg(newRequest("acct-1", 500, "")); err != nil && err != io.EOF {
		return err
	}
	if err := st.CloseSend(); err != nil {
		return err
	}
	return st.RecvMsg(dynamicpb.NewMessage(paymentDesc))
}

// TestStreamsRefused: streaming calls cannot be protected yet, so a
// streaming method the configuration covers (every method by default) is
// refused with FAILED_PRECONDITION (STREAMING_UNSUPPORTED) before its
// handler runs, key or no key, and never runs unprotected; a streaming
// method the configuration leaves out passes through.
func TestStreamsRefused(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		cfg     idemgrpc.Config
		refused bool
	}{
		"default covers every method": {cfg: idemgrpc.Config{}, refused: true},
		"RequireKey":                  {cfg: idemgrpc.Config{RequireKey: true}, refused: true},
		"methods name it":             {cfg: idemgrpc.Config{Methods: []string{methodCreate, methodImport}}, refused: true},
		"covered names it":            {cfg: idemgrpc.Config{Covered: func(m string) bool { return m == methodImport }}, refused: true},
		"methods leave it out":        {cfg: idemgrpc.Config{Methods: []string{methodCreate}}},
		"covered leaves it out":       {cfg: idemgrpc.Config{Covered: func(m string) bool { return m == methodCreate }}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, idemmem.New(nil), nil, tc.cfg, nil)
			ctx := context.Background()
			for _, key := range []string{"", "k"} {
				err := stream(ctx, b.conn, key)
				if !tc.refused {
					if err != nil {
						t.Fatalf("key %q: uncovered stream: %v", key, err)
					}
					continue
				}
				checkRefusal(t, err, codes.FailedPrecondition, idemgrpc.ReasonStreamingUnsupported, false)
			}
			want := int64(0)
			if !tc.refused {
				want = 2
			}
			if got := b.svc.streams.Load(); got != want {
				t.Errorf("the stream handler ran %d times, want %d", got, want)
			}
			// Unary calls are unaffected.
			if a := call(ctx, b.conn, methodCreate, "k", newRequest("acct-1", 500, "")); a.err != nil {
				t.Fatalf("unary call: %v", a.err)
			}
		})
	}
}
