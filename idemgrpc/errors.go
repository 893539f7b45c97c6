package idemgrpc

import (
	"errors"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idem-dev/idem"
)

// ErrorDomain is the domain of the google.rpc.ErrorInfo attached to the
// server interceptor's refusals.
const ErrorDomain = "github.com/idem-dev/idem"

// Reasons of the google.rpc.ErrorInfo attached to the server interceptor's
// refusals: the HTTP middleware's problem codes, in the upper snake case
// that AIP-193 asks of reasons.
const (
	ReasonKeyMissing       = "KEY_MISSING"
	ReasonKeyInvalid       = "KEY_INVALID"
	ReasonKeyReused        = "KEY_REUSED"
	ReasonKeyInUse         = "KEY_IN_USE"
	ReasonOutcomeUnknown   = "OUTCOME_UNKNOWN"
	ReasonNotReplayable    = "NOT_REPLAYABLE"
	ReasonStoreUnavailable = "STORE_UNAVAILABLE"
	ReasonTooManyKeys      = "TOO_MANY_KEYS"
	// ReasonResponseUntrusted refuses, with DATA_LOSS, a call whose key
	// completed but whose stored answer failed verification
	// (idem.ErrResponseUntrusted): it is not replayed, and the handler
	// never runs again for the key.
	ReasonResponseUntrusted = "RESPONSE_UNTRUSTED"
	// ReasonStreamingUnsupported refuses a covered streaming call (see
	// StreamServerInterceptor): it has no HTTP counterpart.
	ReasonStreamingUnsupported = "STREAMING_UNSUPPORTED"
)

// refusal returns a status error with an ErrorInfo of reason and, when
// retry is positive, a RetryInfo.
func refusal(c codes.Code, reason, msg string, retry time.Duration) error {
	st := &spb.Status{Code: int32(c), Message: msg}
	if info, err := anypb.New(&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain}); err == nil {
		st.Details = append(st.Details, info)
	}
	if retry > 0 {
		if ri, err := anypb.New(&errdetails.RetryInfo{RetryDelay: durationpb.New(retry)}); err == nil {
			st.Details = append(st.Details, ri)
		}
	}
	return status.ErrorProto(st)
}

// refusalFor maps an error of idem.Guard.Run that did not come from the
// handler to its status. The messages are client-facing: the cause (a
// store's error) stays in the core's logs.
func refusalFor(err error) error {
	var e *idem.Error
	if !errors.As(err, &e) {
		if errors.Is(err, idem.ErrKeyInvalid) {
			return refusal(codes.InvalidArgument, ReasonKeyInvalid, err.Error(), 0)
		}
		return status.Error(codes.Internal, "idemgrpc: internal error")
	}
	retry := e.RetryAfter
	switch e.Kind {
	case idem.ErrKeyReused:
		return refusal(codes.InvalidArgument, ReasonKeyReused, "idempotency key reused with another request", 0)
	case idem.ErrInProgress:
		return refusal(codes.Aborted, ReasonKeyInUse, "a call with this idempotency key is in progress", atLeast(retry, time.Second))
	case idem.ErrOutcomeUnknown:
		return refusal(codes.FailedPrecondition, ReasonOutcomeUnknown, "the outcome of an earlier call with this idempotency key is unknown", atLeast(retry, time.Second))
	case idem.ErrNotReplayable:
		return refusal(codes.FailedPrecondition, ReasonNotReplayable, "the answer to an earlier call with this idempotency key cannot be replayed", 0)
	case idem.ErrTooManyKeys:
		return refusal(codes.ResourceExhausted, ReasonTooManyKeys, "too many idempotency keys", atLeast(retry, time.Second))
	case idem.ErrResponseUntrusted:
		return refusal(codes.DataLoss, ReasonResponseUntrusted, "the call with this idempotency key completed, but its stored answer failed verification: it is not replayed, and the call is not run again", 0)
	}
	return refusal(codes.Unavailable, ReasonStoreUnavailable, "idempotency store unavailable", atLeast(retry, time.Second))
}

func atLeast(d, min time.Duration) time.Duration {
	if d < min {
		return min
	}
	return d
}
