package idemgrpc_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/idem-dev/idem/idemgrpc"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemtest"
)

// The test service, idem.test.v1.Payments, is described at run time (no
// code generation): CreatePayment(CreatePaymentRequest) returns (Payment),
// the AIP-155 shape with a request_id field, and GetPayment, a read.
const (
	methodCreate = "/idem.test.v1.Payments/CreatePayment"
	methodGet    = "/idem.test.v1.Payments/GetPayment"
	// methodImport is a bidirectional stream: a payment for each request.
	methodImport = "/idem.test.v1.Payments/ImportPayments"
)

var (
	testFiles   = new(protoregistry.Files)
	requestDesc protoreflect.MessageDescriptor
	paymentDesc protoreflect.MessageDescriptor
)

func init() {
	str := descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum()
	i64 := descriptorpb.FieldDescriptorProto_TYPE_INT64.Enum()
	msg := descriptorpb.FieldDescriptorProto_TYPE_MESSAGE.Enum()
	opt := descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()
	rep := descriptorpb.FieldDescriptorProto_LABEL_REPEATED.Enum()
	field := func(name string, n int32, typ *descriptorpb.FieldDescriptorProto_Type) *descriptorpb.FieldDescriptorProto {
		return &descriptorpb.FieldDescriptorProto{Name: proto.String(name), Number: proto.Int32(n), Type: typ, Label: opt}
	}
	labels := &descriptorpb.FieldDescriptorProto{Name: proto.String("labels"), Number: proto.Int32(5), Type: msg, Label: rep,
		TypeName: proto.String(".idem.test.v1.CreatePaymentRequest.LabelsEntry")}
	fdp := &descriptorpb.FileDescriptorProto{
		Name:    proto.String("idem/test/v1/payments.proto"),
		Package: proto.String("idem.test.v1"),
		Syntax:  proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{
			{
				Name: proto.String("CreatePaymentRequest"),
				Field: []*descriptorpb.FieldDescriptorProto{
					field("request_id", 1, str), field("account", 2, str), field("amount_cents", 3, i64),
					field("sent_at", 4, str), labels,
				},
				NestedType: []*descriptorpb.DescriptorProto{{
					Name:    proto.String("LabelsEntry"),
					Field:   []*descriptorpb.FieldDescriptorProto{field("key", 1, str), field("value", 2, str)},
					Options: &descriptorpb.MessageOptions{MapEntry: proto.Bool(true)},
				}},
			},
			{
				Name:  proto.String("Payment"),
				Field: []*descriptorpb.FieldDescriptorProto{field("id", 1, str), field("amount_cents", 2, i64), field("account", 3, str)},
			},
		},
	}
	fd, err := protodesc.NewFile(fdp, nil)
	if err != nil {
		panic(err)
	}
	if err := testFiles.RegisterFile(fd); err != nil {
		panic(err)
	}
	requestDesc = fd.Messages().ByName("CreatePaymentRequest")
	paymentDesc = fd.Messages().ByName("Payment")
}

// testTypes resolves the test service's messages, for Config.Resolver.
var testTypes = dynamicpb.NewTypes(testFiles)

// newRequest returns a CreatePaymentRequest.
func newRequest(account string, amount int64, requestID string) *dynamicpb.Message {
	m := dynamicpb.NewMessage(requestDesc)
	set(m, "account", protoreflect.ValueOfString(account))
	set(m, "amount_cents", protoreflect.ValueOfInt64(amount))
	if requestID != "" {
		set(m, "request_id", protoreflect.ValueOfString(requestID))
	}
	return m
}

func set(m *dynamicpb.Message, name string, v protoreflect.Value) {
	m.Set(m.Descriptor().Fields().ByName(protoreflect.Name(name)), v)
}

func get(m proto.Message, name string) protoreflect.Value {
	r := m.ProtoReflect()
	return r.Get(r.Descriptor().Fields().ByName(protoreflect.Name(name)))
}

// service is the test server's implementation. handle, when set, replaces
// the default handler, which answers a payment named after the run count.
type service struct {
	runs    atomic.Int64
	streams atomic.Int64 // streaming calls that reached their handler
	handle  func(ctx context.Context, req *dynamicpb.Message) (proto.Message, error)
}

func (s *service) serve(ctx context.Context, req *dynamicpb.Message) (proto.Message, error) {
	n := s.runs.Add(1)
	if s.handle != nil {
		return s.handle(ctx, req)
	}
	return payment("pay_"+string(rune('0'+n%10)), get(req, "amount_cents").Int(), get(req, "account").String()), nil
}

func payment(id string, amount int64, account string) *dynamicpb.Message {
	p := dynamicpb.NewMessage(paymentDesc)
	set(p, "id", protoreflect.ValueOfString(id))
	set(p, "amount_cents", protoreflect.ValueOfInt64(amount))
	set(p, "account", protoreflect.ValueOfString(account))
	return p
}

func (s *service) desc() *grpc.ServiceDesc {
	method := func(name, full string) grpc.MethodDesc {
		return grpc.MethodDesc{MethodName: name, Handler: func(_ any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			in := dynamicpb.NewMessage(requestDesc)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) { return s.serve(ctx, req.(*dynamicpb.Message)) }
			if icpt == nil {
				return h(ctx, in)
			}
			return icpt(ctx, in, &grpc.UnaryServerInfo{Server: s, FullMethod: full}, h)
		}}
	}
	return &grpc.ServiceDesc{
		ServiceName: "idem.test.v1.Payments",
		HandlerType: (*any)(nil),
		Methods:     []grpc.MethodDesc{method("CreatePayment", methodCreate), method("GetPayment", methodGet)},
		Streams: []grpc.StreamDesc{{
			StreamName:    "ImportPayments",
			ServerStreams: true,
			ClientStreams: true,
			Handler: func(_ any, stream grpc.ServerStream) error {
				s.streams.Add(1)
				for {
					in := dynamicpb.NewMessage(requestDesc)
					if err := stream.RecvMsg(in); err == io.EOF {
						return nil
					} else if err != nil {
						return err
					}
					if err := stream.SendMsg(payment("imp", get(in, "amount_cents").Int(), get(in, "account").String())); err != nil {
						return err
					}
				}
			},
		}},
		Metadata: "idem/test/v1/payments.proto",
	}
}

// bundle is what setup returns.
type bundle struct {
	store idemstore.Store
	svc   *service
	addr  string // the server's loopback address
	conn  *grpc.ClientConn
	// keys records the idempotency-key metadata of every call that reached
	// the server, in arrival order.
	keys *recorder
}

type recorder struct {
	mu    sync.Mutex
	keys  []string
	outer func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error)
}

func (r *recorder) list() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.keys...)
}

// intercept records the key of a call and hands it to the outer hook, if
// any, which runs before the idem interceptor.
func (r *recorder) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	r.mu.Lock()
	r.keys = append(r.keys, firstOf(md.Get(idemgrpc.MetadataKey)))
	outer := r.outer
	r.mu.Unlock()
	if outer != nil {
		return outer(ctx, req, info, handler)
	}
	return handler(ctx, req)
}

func firstOf(vs []string) string {
	if len(vs) == 0 {
		return ""
	}
	return vs[0]
}

// setup serves the test service on a loopback listener behind the idem
// interceptor on store (cfg completed with a quiet logger, the resolver of
// the test types and store's clock) and returns a client connection to it
// with the client interceptor ccfg (none when nil).
func setup(t *testing.T, store idemstore.Store, clock *idemtest.Clock, cfg idemgrpc.Config, ccfg *idemgrpc.ClientConfig) *bundle {
	t.Helper()
	if cfg.Guard.Logger == nil {
		cfg.Guard.Logger = quietLogger()
	}
	if clock != nil {
		cfg.Guard.Clock = clock
	}
	if cfg.Resolver == nil {
		cfg.Resolver = testTypes
	}
	b := &bundle{store: store, svc: new(service), keys: new(recorder)}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(b.keys.intercept, idemgrpc.UnaryServerInterceptor(store, &cfg)),
		grpc.StreamInterceptor(idemgrpc.StreamServerInterceptor(store, &cfg)))
	srv.RegisterService(b.svc.desc(), b.svc)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	b.addr = ln.Addr().String()
	b.conn = dial(t, b.addr, ccfg)
	return b
}

// dial returns a client connection to addr with the client interceptor
// ccfg (none when nil), reconnecting quickly after a lost connection.
func dial(t *testing.T, addr string, ccfg *idemgrpc.ClientConfig) *grpc.ClientConn {
	t.Helper()
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.6, MaxDelay: 100 * time.Millisecond}, MinConnectTimeout: 5 * time.Second}),
	}
	if ccfg != nil {
		if ccfg.Logger == nil {
			ccfg.Logger = quietLogger()
		}
		opts = append(opts, grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(ccfg)))
	}
	conn, err := grpc.NewClient("passthrough:///"+addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// answer is one call's outcome.
type answer struct {
	reply   *dynamicpb.Message
	header  metadata.MD
	trailer metadata.MD
	err     error
}

func (a answer) replayed() bool {
	return idemgrpc.Replayed(a.header) && idemgrpc.Replayed(a.trailer)
}

// call invokes method with req on conn, with key (when not empty) in the
// metadata.
func call(ctx context.Context, conn *grpc.ClientConn, method, key string, req proto.Message) answer {
	if key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, key)
	}
	a := answer{reply: dynamicpb.NewMessage(paymentDesc)}
	a.err = conn.Invoke(ctx, method, req, a.reply, grpc.Header(&a.header), grpc.Trailer(&a.trailer))
	return a
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newTestClock() *idemtest.Clock {
	return idemtest.NewClock(time.Now().Truncate(time.Millisecond))
}

// downStore is a store whose reservations fail while down is set, as a
// store outage does.
type downStore struct {
	idemstore.Store
	down atomic.Bool
}

func (s *downStore) KeyReserve(ctx context.Context, p *idemstore.ReserveParams) (*idemstore.ReserveResult, error) {
	if s.down.Load() {
		return nil, errors.New("dial tcp: connection refused")
	}
	return s.Store.KeyReserve(ctx, p)
}

// lossyRelay is a TCP relay between a gRPC client and server that loses
// the answers on its first `lose` connections: it passes the client's
// bytes and the server's connection set-up through, and when the server
// starts answering a call (its first HEADERS frame on a stream, sent once
// the call went through), it drops that frame and closes both connections.
// The client sees UNAVAILABLE for a call the server has handled.
type lossyRelay struct {
	ln     net.Listener
	target string
	lose   int64
	conns  atomic.Int64
	lost   atomic.Int64
}

func newLossyRelay(t *testing.T, target string, lose int) *lossyRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &lossyRelay{ln: ln, target: target, lose: int64(lose)}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			lossy := r.conns.Add(1) <= r.lose
			wg.Add(1)
			go func() {
				defer wg.Done()
				r.relay(c, lossy)
			}()
		}
	}()
	return r
}

func (r *lossyRelay) addr() string { return r.ln.Addr().String() }

func (r *lossyRelay) relay(client net.Conn, lossy bool) {
	defer client.Close()
	server, err := net.Dial("tcp", r.target)
	if err != nil {
		return
	}
	defer server.Close()
	go func() {
		io.Copy(server, client)
		server.Close()
	}()
	// Server to client, frame by frame (RFC 9113 section 4.1: a 9-byte
	// header with a 24-bit length, the type and the stream).
	br := bufio.NewReader(server)
	var head [9]byte
	for {
		if _, err := io.ReadFull(br, head[:]); err != nil {
			return
		}
		n := int(head[0])<<16 | int(head[1])<<8 | int(head[2])
		payload := make([]byte, n)
		if _, err := io.ReadFull(br, payload); err != nil {
			return
		}
		const frameHeaders = 0x1
		if lossy && head[3] == frameHeaders && binary.BigEndian.Uint32(head[5:])&0x7fffffff != 0 {
			r.lost.Add(1)
			return // the answer is lost with the connection
		}
		if _, err := client.Write(append(head[:], payload...)); err != nil {
			return
		}
	}
}
