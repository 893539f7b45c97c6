package idemgrpc_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-dev/idem/idemgrpc"
	"github.com/idem-dev/idem/idemmem"
)

// chargeFunc implements shop.v1.Payments/Charge, a service written
// without code generation: it takes and returns a google.protobuf.Struct.
// paymentsServiceDesc stands in for generated code's Payments_ServiceDesc.
type chargeFunc func(context.Context, *structpb.Struct) (*structpb.Struct, error)

var paymentsServiceDesc = grpc.ServiceDesc{
	ServiceName: "shop.v1.Payments",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Charge",
		Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			req := new(structpb.Struct)
			if err := dec(req); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) { return srv.(chargeFunc)(ctx, req.(*structpb.Struct)) }
			if icpt == nil {
				return h(ctx, req)
			}
			return icpt(ctx, req, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/shop.v1.Payments/Charge"}, h)
		},
	}},
}

// A server that charges at most once per key, and a client that sends the
// same call twice with one key: the second answer is the stored one. The
// README's gRPC section is this example's body, between the "README"
// comments (TestReadmeSnippets in the module's root checks it).
func Example() {
	store := idemmem.New(nil) // idemsqlite, idempgx or idemredis in production
	// README
	cfg := &idemgrpc.Config{
		Methods: []string{"/shop.v1.Payments/Charge"}, // the mutations; nil covers every method
	}
	srv := grpc.NewServer(
		grpc.UnaryInterceptor(idemgrpc.UnaryServerInterceptor(store, cfg)),
		grpc.StreamInterceptor(idemgrpc.StreamServerInterceptor(store, cfg)), // refuses covered streams
	)
	var charges atomic.Int64
	srv.RegisterService(&paymentsServiceDesc, chargeFunc(func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		n := charges.Add(1)
		return structpb.NewStruct(map[string]any{"id": fmt.Sprintf("ch_%d", n), "amount": req.Fields["amount"].GetNumberValue()})
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Stop()

	conn, err := grpc.NewClient(ln.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(nil))) // adds a key, retries with it
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()

	// The caller may choose the key of a logical call (to resume it after a
	// restart); without one, the client interceptor makes a UUID.
	ctx := metadata.AppendToOutgoingContext(context.Background(), idemgrpc.MetadataKey, "order-1042")
	req, _ := structpb.NewStruct(map[string]any{"amount": 500})
	for range 2 {
		var header metadata.MD
		resp := new(structpb.Struct)
		if err := conn.Invoke(ctx, "/shop.v1.Payments/Charge", req, resp, grpc.Header(&header)); err != nil {
			log.Fatal(err)
		}
		fmt.Println(resp.Fields["id"].GetStringValue(), "replayed:", idemgrpc.Replayed(header))
	}
	fmt.Println("charges:", charges.Load())
	// README

	// Output:
	// ch_1 replayed: false
	// ch_1 replayed: true
	// charges: 1
}
