package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
)

// Metadata entries the interceptors read and write.
const (
	// MetadataKey is the request metadata entry that carries the
	// idempotency key (gRPC metadata names are lower case).
	MetadataKey = "idempotency-key"
	// MetadataReplayed is set to "true" in the header and trailer metadata
	// of an answer replayed from the store.
	MetadataReplayed = "idempotent-replayed"
)

// Names under which a stored answer's metadata is kept in the record, so
// that idem keys and the console show what the body is.
const (
	metaContentType = "Content-Type"
	metaMessageType = "Grpc-Message-Type"
	metaStatus      = "Grpc-Status"
	contentType     = "application/grpc+proto"
	statusTypeName  = "google.rpc.Status"
)

// Config configures UnaryServerInterceptor and StreamServerInterceptor. A
// nil *Config means all defaults.
type Config struct {
	// Guard configures the core (idem.GuardConfig): TTL, Lease, Wait,
	// MaxResponse (the largest response message stored), Keyring,
	// Transactional, Metrics, Logger and the others. Its zero value means
	// idem's defaults.
	Guard idem.GuardConfig
	// Methods are the covered full method names ("/pkg.Service/Method").
	// Defaults to nil, which covers every method; an empty, non-nil slice
	// covers none.
	// Covered, when set, takes precedence. UnaryServerInterceptor protects
	// the covered unary methods; StreamServerInterceptor refuses the
	// covered streaming methods.
	Methods []string
	// Covered reports whether a full method name is covered. Defaults to
	// membership in Methods.
	Covered func(fullMethod string) bool
	// RequireKey answers INVALID_ARGUMENT (reason KEY_MISSING) to a covered
	// call without a key. Defaults to false: such calls run unprotected.
	RequireKey bool
	// KeyField names a string field of the request message that carries
	// the key when the metadata has none, as AIP-155's request_id does
	// ("request_id"). A message without such a field, or with it empty,
	// has no key from it; a field of another kind is a server error
	// (INTERNAL). A call whose metadata key and field disagree is refused
	// with INVALID_ARGUMENT (KEY_INVALID). Defaults to none.
	KeyField string
	// FingerprintExclude names top-level fields of the request left out of
	// the fingerprint (a client timestamp, an attempt counter): a retry
	// that changes only them is the same request. Defaults to none.
	FingerprintExclude []string
	// Scope returns the tenant or principal of a call (from the
	// authenticated peer or metadata, never from the message). An error
	// answers UNAUTHENTICATED with the error's text withheld. Defaults to
	// a single empty scope.
	Scope func(ctx context.Context, fullMethod string) (string, error)
	// Release reports whether a handler's error status releases the key
	// (a retry runs the handler again) rather than being stored and
	// replayed. Defaults to DefaultRelease.
	Release func(st *status.Status) bool
	// Resolver finds the Go type of a stored response message by its full
	// name, to replay it as that type. A type it does not know is replayed
	// as the stored bytes (the client decodes them as usual; interceptors
	// outside this one see an empty message carrying them as unknown
	// fields). Defaults to protoregistry.GlobalTypes, where generated code
	// registers its messages.
	Resolver protoregistry.MessageTypeResolver
}

// DefaultRelease is the default of Config.Release: the codes HTTP maps to
// 5xx, 408, 425 or 429 (CANCELLED, UNKNOWN, DEADLINE_EXCEEDED,
// RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS),
// and ABORTED, release the key; the codes HTTP maps to other 4xx
// (INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED,
// FAILED_PRECONDITION, OUT_OF_RANGE, UNAUTHENTICATED) are stored. See the
// package documentation for the table and why.
func DefaultRelease(st *status.Status) bool {
	switch st.Code() {
	case codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.PermissionDenied,
		codes.FailedPrecondition, codes.OutOfRange, codes.Unauthenticated, codes.OK:
		return false
	}
	return true
}

// httpStatus returns the HTTP status a gRPC code corresponds to, as
// gRPC-HTTP gateways map it (CANCELLED is 499). The store keeps it as a
// record's status.
func httpStatus(c codes.Code) int {
	switch c {
	case codes.OK:
		return 200
	case codes.Canceled:
		return 499
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		return 400
	case codes.Unauthenticated:
		return 401
	case codes.PermissionDenied:
		return 403
	case codes.NotFound:
		return 404
	case codes.AlreadyExists, codes.Aborted:
		return 409
	case codes.ResourceExhausted:
		return 429
	case codes.Unimplemented:
		return 501
	case codes.Unavailable:
		return 503
	case codes.DeadlineExceeded:
		return 504
	}
	return 500
}

type server struct {
	guard    *idem.Guard
	covered  func(string) bool
	require  bool
	keyField protoreflect.Name
	exclude  []protoreflect.Name
	scope    func(context.Context, string) (string, error)
	release  func(*status.Status) bool
	resolver protoregistry.MessageTypeResolver
}

// UnaryServerInterceptor returns an interceptor that runs each covered
// unary call at most once per idempotency key on store, stores its answer
// and answers retries with it (see the package documentation). A nil cfg
// means all defaults. Like idem.NewGuard, it panics when
// cfg.Guard.Transactional is set and store does not implement
// idemstore.TxStore.
func UnaryServerInterceptor(store idemstore.Store, cfg *Config) grpc.UnaryServerInterceptor {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	s := &server{
		guard:    idem.NewGuard(store, &c.Guard),
		covered:  coverage(c.Methods, c.Covered),
		require:  c.RequireKey,
		keyField: protoreflect.Name(c.KeyField),
		scope:    c.Scope,
		release:  c.Release,
		resolver: c.Resolver,
	}
	for _, name := range c.FingerprintExclude {
		s.exclude = append(s.exclude, protoreflect.Name(name))
	}
	if s.release == nil {
		s.release = DefaultRelease
	}
	if s.resolver == nil {
		s.resolver = protoregistry.GlobalTypes
	}
	return s.intercept
}

// StreamServerInterceptor returns an interceptor that refuses every covered
// streaming call with FAILED_PRECONDITION (reason STREAMING_UNSUPPORTED)
// before its handler runs, with or without a key. Streaming calls are not
// protected yet, and a stream the configuration names as covered
// (Config.Methods or Config.Covered, every method when both are unset)
// must not run as though it were. Install it next to UnaryServerInterceptor
// with the same store and cfg:
//
//	srv := grpc.NewServer(
//		grpc.UnaryInterceptor(idemgrpc.UnaryServerInterceptor(store, cfg)),
//		grpc.StreamInterceptor(idemgrpc.StreamServerInterceptor(store, cfg)),
//	)
//
// and leave the streaming methods that may run unprotected (reads,
// watches) out of Methods or Covered: a stream that is not covered passes
// through. Each refusal is logged (Config.Guard's Logger) with the method.
// store is not used yet; it is taken so that covering streams later needs
// no change here.
func StreamServerInterceptor(store idemstore.Store, cfg *Config) grpc.StreamServerInterceptor {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	covered := coverage(c.Methods, c.Covered)
	log := slog.Default()
	if c.Guard.Logger != nil {
		log = c.Guard.Logger
	}
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if !covered(info.FullMethod) {
			return handler(srv, ss)
		}
		log.Warn("idemgrpc: refused a covered streaming call: streaming calls are not protected; leave the method out of Config.Methods or Config.Covered to let it run unprotected", "method", info.FullMethod)
		return refusal(codes.FailedPrecondition, ReasonStreamingUnsupported,
			"idempotency keys are not supported on streaming calls, and this server covers the method: the call was refused without running", 0)
	}
}

// coverage returns the covered-method predicate of a config.
func coverage(methods []string, covered func(string) bool) func(string) bool {
	switch {
	case covered != nil:
		return covered
	case methods == nil:
		return func(string) bool { return true }
	}
	methods = slices.Clone(methods)
	return func(m string) bool { return slices.Contains(methods, m) }
}

func (s *server) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if !s.covered(info.FullMethod) {
		return handler(ctx, req)
	}
	msg, ok := req.(proto.Message)
	if !ok {
		return nil, status.Error(codes.Internal, "idemgrpc: the request is not a protocol buffers message")
	}
	key, found, err := s.key(ctx, msg)
	if err != nil {
		return nil, err
	}
	if !found {
		if s.require {
			return nil, refusal(codes.InvalidArgument, ReasonKeyMissing, "idempotency key missing: send the "+MetadataKey+" metadata entry", 0)
		}
		return handler(ctx, req)
	}
	var scope string
	if s.scope != nil {
		if scope, err = s.scope(ctx, info.FullMethod); err != nil {
			return nil, status.Error(codes.Unauthenticated, "unauthenticated")
		}
	}
	fp, err := s.fingerprint(info.FullMethod, msg)
	if err != nil {
		return nil, status.Error(codes.Internal, "idemgrpc: fingerprinting the request failed")
	}

	var (
		ran     bool
		hresp   any
		herr    error
		errBack bool // fn returned herr: the key was released
	)
	res, replayed, err := s.guard.Run(ctx, idem.Call{
		Identity:    idemstore.Identity{Scope: scope, Endpoint: info.FullMethod, Key: key},
		Fingerprint: fp,
	}, func(ctx context.Context) (idem.Result, error) {
		ran = true
		hresp, herr = handler(ctx, req)
		if herr != nil {
			st := status.Convert(herr)
			if s.release(st) {
				errBack = true
				return idem.Result{}, herr
			}
			return encodeStatus(st), nil
		}
		return encodeMessage(hresp), nil
	})
	if ran {
		if err != nil && !errBack && !errors.Is(err, idem.ErrNotRecorded) {
			// A transactional completion that did not commit: the
			// handler's effect was rolled back, its answer must not go out.
			return nil, refusalFor(err)
		}
		return hresp, herr
	}
	if err != nil {
		return nil, refusalFor(err)
	}
	if !replayed { // cannot happen: Run either ran fn, refused or replayed
		return nil, status.Error(codes.Internal, "idemgrpc: no answer")
	}
	md := metadata.Pairs(MetadataReplayed, "true")
	grpc.SetHeader(ctx, md)
	grpc.SetTrailer(ctx, md)
	return s.decode(res)
}

// key returns the call's key from the metadata or the request field.
func (s *server) key(ctx context.Context, msg proto.Message) (key string, found bool, err error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if vs := md.Get(MetadataKey); len(vs) > 0 {
		if key, err = idem.ParseKey(vs); err != nil {
			return "", false, refusal(codes.InvalidArgument, ReasonKeyInvalid, err.Error(), 0)
		}
		found = true
	}
	if s.keyField == "" {
		return key, found, nil
	}
	m := msg.ProtoReflect()
	fd := m.Descriptor().Fields().ByName(s.keyField)
	if fd == nil {
		return key, found, nil
	}
	if fd.Kind() != protoreflect.StringKind || fd.IsList() || fd.IsMap() {
		return "", false, status.Errorf(codes.Internal, "idemgrpc: KeyField %q of %s is not a string field", s.keyField, m.Descriptor().FullName())
	}
	v := m.Get(fd).String()
	switch {
	case v == "":
		return key, found, nil
	case found && v != key:
		return "", false, refusal(codes.InvalidArgument, ReasonKeyInvalid, fmt.Sprintf("the %s metadata entry and the request's %s field differ", MetadataKey, s.keyField), 0)
	}
	return v, true, nil
}

// fingerprint hashes the deterministic encoding of msg, without the
// excluded fields, for method.
func (s *server) fingerprint(method string, msg proto.Message) (string, error) {
	if len(s.exclude) > 0 {
		msg = proto.Clone(msg)
		m := msg.ProtoReflect()
		fields := m.Descriptor().Fields()
		for _, name := range s.exclude {
			if fd := fields.ByName(name); fd != nil {
				m.Clear(fd)
			}
		}
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		return "", err
	}
	return idem.FingerprintBytes(method, b), nil
}

// encodeMessage is the stored form of a handler's response.
func encodeMessage(resp any) idem.Result {
	msg, ok := resp.(proto.Message)
	if !ok {
		// Delivered but not storable: retries get NOT_REPLAYABLE, never a
		// second run.
		return idem.Result{NotReplayable: true}
	}
	body, err := proto.Marshal(msg)
	if err != nil {
		return idem.Result{NotReplayable: true}
	}
	return idem.Result{
		Status: 200,
		Meta: map[string][]string{
			metaContentType: {contentType},
			metaMessageType: {string(msg.ProtoReflect().Descriptor().FullName())},
		},
		Body: body,
	}
}

// encodeStatus is the stored form of a handler's final error status.
func encodeStatus(st *status.Status) idem.Result {
	body, err := proto.Marshal(st.Proto())
	if err != nil {
		return idem.Result{NotReplayable: true}
	}
	return idem.Result{
		Status: httpStatus(st.Code()),
		Meta: map[string][]string{
			metaContentType: {contentType},
			metaMessageType: {statusTypeName},
			metaStatus:      {strconv.Itoa(int(st.Code()))},
		},
		Body: body,
	}
}

// decode turns a stored result back into the handler's answer.
func (s *server) decode(res idem.Result) (any, error) {
	if len(res.Meta[metaStatus]) > 0 {
		st := new(spb.Status)
		if err := proto.Unmarshal(res.Body, st); err != nil {
			return nil, status.Error(codes.Internal, "idemgrpc: the stored status cannot be decoded")
		}
		return nil, status.ErrorProto(st)
	}
	if names := res.Meta[metaMessageType]; len(names) == 1 {
		if mt, err := s.resolver.FindMessageByName(protoreflect.FullName(names[0])); err == nil {
			msg := mt.New().Interface()
			if err := proto.Unmarshal(res.Body, msg); err == nil {
				return msg, nil
			}
		}
	}
	// An unknown type: the stored bytes, sent as they are.
	raw := new(emptypb.Empty)
	raw.ProtoReflect().SetUnknown(res.Body)
	return raw, nil
}
