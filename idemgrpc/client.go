package idemgrpc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/idem-dev/idem/idemclient"
)

// Defaults of ClientConfig.
const (
	DefaultRetryWaitMin = 250 * time.Millisecond
	DefaultRetryWaitMax = 30 * time.Second
	DefaultRetryMax     = 6
	DefaultMaxElapsed   = 2 * time.Minute
)

// RetryInfoLimit is the longest RetryInfo delay the default backoffs honour;
// a longer one is cut to it.
const RetryInfoLimit = 24 * time.Hour

// CheckRetry decides, after a failed attempt of a keyed call, whether to
// send it again. err is the attempt's error (a status error as the invoker
// returns it). Returning an error stops the retries and makes the call
// return that error.
type CheckRetry func(ctx context.Context, err error) (bool, error)

// Backoff returns how long to wait before the next attempt. attempt is 0
// before the first retry, 1 before the second, and so on; err is the failed
// attempt's error.
type Backoff func(min, max time.Duration, attempt int, err error) time.Duration

// ClientConfig configures UnaryClientInterceptor. A nil *ClientConfig means
// all defaults; zero fields mean their defaults.
type ClientConfig struct {
	// Methods are the covered full method names ("/pkg.Service/Method"):
	// calls to them get a key and are retried. Defaults to nil, which
	// covers every unary call; an empty, non-nil slice covers none. Covered, when set, takes
	// precedence. Calls that are not covered pass through untouched, and
	// are not retried.
	Methods []string
	// Covered reports whether a full method name is covered. Defaults to
	// membership in Methods.
	Covered func(fullMethod string) bool
	// KeyField names a string field of the request (AIP-155's
	// "request_id"): when the outgoing metadata has no key and the field is
	// set, its value is the key, sent in the metadata too. The request is
	// never modified. Defaults to none.
	KeyField string
	// NewKey makes the key of a covered call that has none, in its outgoing
	// metadata or in KeyField. Defaults to idemclient.NewKeyV4. An error, or an
	// empty key, fails the call with INTERNAL before anything is sent.
	NewKey func() (string, error)
	// RetryWaitMin and RetryWaitMax bound the waits computed by Backoff.
	// Default to 250 ms and 30 s.
	RetryWaitMin, RetryWaitMax time.Duration
	// RetryMax is the most attempts after the first. Defaults to 6; a
	// negative value makes one attempt.
	RetryMax int
	// MaxElapsed bounds the whole call: no wait that would end past it is
	// started, and the last error is returned instead. Defaults to 2
	// minutes; a negative value means no bound (the call's context still
	// bounds it).
	MaxElapsed time.Duration
	// AttemptTimeout, when positive, bounds each attempt: an attempt whose
	// answer does not arrive in time ends with DEADLINE_EXCEEDED and is
	// retried while the call's own context lasts. Defaults to none.
	AttemptTimeout time.Duration
	// CheckRetry is the retry policy. Defaults to DefaultRetryPolicy.
	CheckRetry CheckRetry
	// Backoff computes the wait before a retry. Defaults to DefaultBackoff.
	Backoff Backoff
	// UnknownOutcomeBackoff computes the wait before retrying
	// FAILED_PRECONDITION with reason OUTCOME_UNKNOWN. Defaults to
	// DefaultUnknownOutcomeBackoff.
	UnknownOutcomeBackoff Backoff
	// DisableUnknownOutcomeRetry returns OUTCOME_UNKNOWN to the caller at
	// once instead of waiting for the server to reconcile the call.
	// Defaults to false.
	DisableUnknownOutcomeRetry bool
	// Logger receives a debug record per retry and a warning when the
	// retries run out. Keys appear only as a short hash (attribute
	// idempotency_key_hash: the first 16 hex digits of the key's SHA-256,
	// as idemclient logs it). Defaults to slog.Default().
	Logger *slog.Logger
}

// Replayed reports whether header or trailer metadata (from grpc.Header or
// grpc.Trailer) marks an answer replayed from the server's store.
func Replayed(md metadata.MD) bool {
	vs := md.Get(MetadataReplayed)
	return len(vs) > 0 && vs[0] == "true"
}

// ErrorReason returns the reason of the google.rpc.ErrorInfo in err's
// status details when its domain is ErrorDomain, else "".
func ErrorReason(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return ""
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain {
			return info.GetReason()
		}
	}
	return ""
}

// RetryDelay returns the delay of the google.rpc.RetryInfo in err's status
// details, if it has one.
func RetryDelay(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return 0, false
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			dur := ri.GetRetryDelay().AsDuration()
			if dur < 0 {
				dur = 0
			}
			return min(dur, RetryInfoLimit), true
		}
	}
	return 0, false
}

// DefaultRetryPolicy is the policy for keyed calls, which a server running
// UnaryServerInterceptor executes at most once. It retries UNAVAILABLE and
// DEADLINE_EXCEEDED (the call may not have reached the server, or its answer
// was lost), ABORTED (in progress, or a conflict the handler asks to retry),
// RESOURCE_EXHAUSTED, INTERNAL and UNKNOWN (the server released the key),
// and FAILED_PRECONDITION with reason OUTCOME_UNKNOWN. It never retries the
// other codes (among them INVALID_ARGUMENT: a reused key is final), and
// stops with the context's error once ctx is done.
func DefaultRetryPolicy(ctx context.Context, err error) (bool, error) {
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.ResourceExhausted,
		codes.Internal, codes.Unknown:
		return true, nil
	case codes.FailedPrecondition:
		return ErrorReason(err) == ReasonOutcomeUnknown, nil
	}
	return false, nil
}

// DefaultBackoff waits as long as the error's RetryInfo says when it has
// one, and otherwise as idemclient.DefaultBackoff does without Retry-After:
// a duration drawn uniformly from [0, min(max, min·2^attempt)] (exponential
// backoff with full jitter).
func DefaultBackoff(min, max time.Duration, attempt int, err error) time.Duration {
	if d, ok := RetryDelay(err); ok {
		return d
	}
	return idemclient.DefaultBackoff(min, max, attempt, nil)
}

// DefaultUnknownOutcomeBackoff is the backoff after OUTCOME_UNKNOWN, which
// resolves only when the server reconciles the call: the RetryInfo delay
// when there is one (but at least min), otherwise as
// idemclient.DefaultUnknownOutcomeBackoff does without Retry-After: a
// duration drawn from the upper half of [0, min(4·max, 4·min·2^attempt)].
func DefaultUnknownOutcomeBackoff(min, max time.Duration, attempt int, err error) time.Duration {
	if d, ok := RetryDelay(err); ok {
		if d < min {
			return min
		}
		return d
	}
	return idemclient.DefaultUnknownOutcomeBackoff(min, max, attempt, nil)
}

type client struct {
	covered  func(string) bool
	keyField protoreflect.Name
	cfg      ClientConfig
}

// UnaryClientInterceptor returns an interceptor that attaches an
// idempotency key to covered calls that have none and retries them with
// that key (see the package documentation and ClientConfig). The caller
// chooses the key of a logical call by putting it in the outgoing metadata
// (metadata.AppendToOutgoingContext(ctx, MetadataKey, key)), for instance
// to resume the call after its own restart. A nil cfg means all defaults.
func UnaryClientInterceptor(cfg *ClientConfig) grpc.UnaryClientInterceptor {
	var c ClientConfig
	if cfg != nil {
		c = *cfg
	}
	if c.NewKey == nil {
		c.NewKey = idemclient.NewKeyV4
	}
	if c.RetryWaitMin <= 0 {
		c.RetryWaitMin = DefaultRetryWaitMin
	}
	if c.RetryWaitMax <= 0 {
		c.RetryWaitMax = DefaultRetryWaitMax
	}
	switch {
	case c.RetryMax == 0:
		c.RetryMax = DefaultRetryMax
	case c.RetryMax < 0:
		c.RetryMax = 0
	}
	switch {
	case c.MaxElapsed == 0:
		c.MaxElapsed = DefaultMaxElapsed
	case c.MaxElapsed < 0:
		c.MaxElapsed = 0
	}
	if c.CheckRetry == nil {
		c.CheckRetry = DefaultRetryPolicy
	}
	if c.Backoff == nil {
		c.Backoff = DefaultBackoff
	}
	if c.UnknownOutcomeBackoff == nil {
		c.UnknownOutcomeBackoff = DefaultUnknownOutcomeBackoff
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	cl := &client{covered: coverage(c.Methods, c.Covered), keyField: protoreflect.Name(c.KeyField), cfg: c}
	return cl.intercept
}

func (c *client) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if !c.covered(method) {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	key, attach, err := c.key(ctx, req)
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	if attach {
		ctx = metadata.AppendToOutgoingContext(ctx, MetadataKey, key)
	}
	cfg := &c.cfg
	log := cfg.Logger.With(slog.String("method", method), slog.String("idempotency_key_hash", keyHash(key)))
	start := time.Now()
	for attempt := 1; ; attempt++ {
		actx, cancel := ctx, context.CancelFunc(func() {})
		if cfg.AttemptTimeout > 0 {
			actx, cancel = context.WithTimeout(ctx, cfg.AttemptTimeout)
		}
		err := invoker(actx, method, req, reply, cc, opts...)
		cancel()
		if err == nil {
			return nil
		}
		retry, cerr := cfg.CheckRetry(ctx, err)
		if cerr != nil {
			if ctx.Err() != nil && cerr == ctx.Err() {
				return status.FromContextError(cerr).Err()
			}
			return cerr
		}
		unknown := status.Code(err) == codes.FailedPrecondition && ErrorReason(err) == ReasonOutcomeUnknown
		if !retry || (unknown && cfg.DisableUnknownOutcomeRetry) {
			return err
		}
		if attempt > cfg.RetryMax {
			log.Warn("idemgrpc: giving up after retries", "attempts", attempt, "code", status.Code(err).String())
			return err
		}
		backoff := cfg.Backoff
		if unknown {
			backoff = cfg.UnknownOutcomeBackoff
		}
		wait := backoff(cfg.RetryWaitMin, cfg.RetryWaitMax, attempt-1, err)
		if cfg.MaxElapsed > 0 && time.Since(start)+wait > cfg.MaxElapsed {
			log.Warn("idemgrpc: giving up, the next wait would pass MaxElapsed", "attempts", attempt, "code", status.Code(err).String())
			return err
		}
		log.Debug("idemgrpc: retrying", "attempt", attempt, "code", status.Code(err).String(), "wait", wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return status.FromContextError(ctx.Err()).Err()
		case <-t.C:
		}
	}
}

// key returns the key of a covered call, and whether to attach it: not
// when its outgoing metadata already has one.
func (c *client) key(ctx context.Context, req any) (key string, attach bool, err error) {
	md, _ := metadata.FromOutgoingContext(ctx)
	if vs := md.Get(MetadataKey); len(vs) > 0 {
		return vs[0], false, nil
	}
	if c.keyField != "" {
		if msg, ok := req.(proto.Message); ok {
			m := msg.ProtoReflect()
			if fd := m.Descriptor().Fields().ByName(c.keyField); fd != nil && fd.Kind() == protoreflect.StringKind && !fd.IsList() && !fd.IsMap() {
				if v := m.Get(fd).String(); v != "" {
					return v, true, nil
				}
			}
		}
	}
	key, err = c.cfg.NewKey()
	if err != nil {
		return "", false, fmt.Errorf("idemgrpc: ClientConfig.NewKey: %w", err)
	}
	if key == "" {
		return "", false, errors.New("idemgrpc: ClientConfig.NewKey returned an empty key")
	}
	return key, true, nil
}

// keyHash is the short hash under which keys appear in logs.
func keyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:8])
}
