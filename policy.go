package idem

import "net/http"

// handled is what the after-the-handler policy needs to know about a
// handler that ran. It holds no net/http types: the policy decides on
// facts, whoever gathered them.
type handled struct {
	status   int  // the status the handler answered with
	streamed bool // the answer went out before it ended (Flush, Hijack, over MaxResponse)
	panicked bool // the handler panicked or aborted its answer: status says nothing
	rejected bool // the handler called Reject
	unknown  bool // the handler called MarkUnknown
	failed   bool // the function returned an error (Guard): no effect, as a 5xx says
}

// recordAs is what becomes of the record once its handler has run.
type recordAs uint8

const (
	// recordCompleted stores the response; retries replay it.
	recordCompleted recordAs = iota
	// recordNotReplayable completes the record without a response; retries
	// get 409 not-replayable, never a second execution.
	recordNotReplayable
	// recordReleased releases the key; the next retry re-executes.
	recordReleased
	// recordUnknown marks the outcome unknown; no retry re-executes it until
	// reconciliation settles it.
	recordUnknown
	// recordDropped deletes the record; the corrected request may reuse the key.
	recordDropped
)

// outcome is the policy's answer: what the record becomes, and whether the
// business transaction rolls back first (transactional mode).
type outcome struct {
	record   recordAs
	rollback bool
}

// afterHandler is the after-the-handler policy of SPEC section 3, in one
// place for the plain and the transactional path:
//
//   - a panic marks the outcome unknown, or releases the key in
//     transactional mode, where the transaction rolled back;
//   - a rejection (Reject) drops the record;
//   - MarkUnknown marks it unknown;
//   - 5xx, 408, 425 and 429 release the key, except that the Stripe
//     profile stores 5xx once the handler ran (outside transactional mode,
//     where a 5xx always rolls back); so does an error from a Guard's
//     function, whatever the profile;
//   - everything else (2xx, 3xx, the other 4xx) completes the record,
//     without a stored response when the answer was streamed.
//
// In transactional mode every outcome but a completion rolls the business
// transaction back.
func afterHandler(h handled, profile Profile, transactional bool) outcome {
	var rec recordAs
	switch {
	case h.panicked && transactional:
		rec = recordReleased
	case h.panicked:
		rec = recordUnknown
	case h.rejected:
		rec = recordDropped
	case h.unknown:
		rec = recordUnknown
	case h.failed || releases(h.status, profile, transactional):
		rec = recordReleased
	case h.streamed:
		rec = recordNotReplayable
	default:
		rec = recordCompleted
	}
	done := rec == recordCompleted || rec == recordNotReplayable
	return outcome{record: rec, rollback: transactional && !done}
}

// releases reports whether a response of this status releases the key so a
// retry re-executes.
func releases(status int, profile Profile, transactional bool) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests:
		return true
	}
	return status >= 500 && (transactional || profile != ProfileStripe)
}
