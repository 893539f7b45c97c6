package idem_test

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"
)

// chargeFunc implements shop.v1.Payments/Charge for the README's gRPC
// example, a service written without code generation (generated code
// provides the grpc.ServiceDesc, as Payments_ServiceDesc).
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
