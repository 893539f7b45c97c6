package cli

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemgrpc"
)

// TestKeysShowRecordsOfEveryAdapter: records written by the gRPC
// interceptor and by idem.Do are listed and shown by `idem keys` like the
// HTTP middleware's, the endpoint naming the gRPC method or the function's
// operation.
func TestKeysShowRecordsOfEveryAdapter(t *testing.T) {
	t.Parallel()
	b := urlBackend(t, "sqlite", sqliteURL(t))
	b.open = openExisting
	ctx := context.Background()

	// A unary gRPC call through the server interceptor.
	intercept := idemgrpc.UnaryServerInterceptor(b.store, nil)
	req, _ := structpb.NewStruct(map[string]any{"amount": 500})
	gctx := metadata.NewIncomingContext(ctx, metadata.Pairs(idemgrpc.MetadataKey, "grpc-order-1"))
	_, err := intercept(gctx, req, &grpc.UnaryServerInfo{FullMethod: "/shop.v1.Payments/Charge"},
		func(ctx context.Context, req any) (any, error) {
			return structpb.NewStruct(map[string]any{"id": "ch_1"})
		})
	if err != nil {
		t.Fatal(err)
	}
	// A plain function through idem.Do.
	g := idem.NewGuard(b.store, nil)
	if _, err := idem.Do(ctx, g, "evt_1", "webhook payment.succeeded", map[string]any{"id": "evt_1"},
		func(context.Context) (string, error) { return "credit_1", nil }); err != nil {
		t.Fatal(err)
	}

	code, out, stderr := b.keys(t, nil, "list")
	if code != ExitOK {
		t.Fatalf("idem keys list: exit %d, %s", code, stderr)
	}
	for _, row := range []string{`/shop.v1.Payments/Charge\s+grpc-order-1\s+completed`, `webhook payment.succeeded\s+evt_1\s+completed`} {
		if !regexp.MustCompile(`(?m)` + row).MatchString(out) {
			t.Errorf("idem keys list lacks %q:\n%s", row, out)
		}
	}
	code, out, stderr = b.keys(t, nil, "show", "--endpoint", "/shop.v1.Payments/Charge", "grpc-order-1")
	if code != ExitOK || !strings.Contains(out, "/shop.v1.Payments/Charge") || !strings.Contains(out, "completed") {
		t.Errorf("idem keys show of the gRPC record: exit %d\n%s\nstderr %s", code, out, stderr)
	}
}
