package idem

import (
	"fmt"
	"testing"
)

// TestAfterHandler mirrors SPEC section 3, "After the handler", row by row:
// each group below is one row of the contract, quoted, with the cases that
// pin it down in the plain and the transactional mode. The rows about what
// a completion stores and on which context it is written are not decisions
// of the policy; TestReplay and TestClientDisconnectStillStores cover them.
func TestAfterHandler(t *testing.T) {
	t.Parallel()
	completed := outcome{record: recordCompleted}
	notReplayable := outcome{record: recordNotReplayable}
	released := outcome{record: recordReleased}
	releasedTx := outcome{record: recordReleased, rollback: true}
	unknown := outcome{record: recordUnknown}
	unknownTx := outcome{record: recordUnknown, rollback: true}
	dropped := outcome{record: recordDropped}
	droppedTx := outcome{record: recordDropped, rollback: true}

	type tc struct {
		h       handled
		profile Profile
		tx      bool
		want    outcome
	}
	rows := []struct {
		spec  string
		cases []tc
	}{
		{"2xx, 3xx and 4xx (except 408, 425, 429) are stored and the record is completed", []tc{
			{h: handled{status: 200}, want: completed},
			{h: handled{status: 201}, want: completed},
			{h: handled{status: 204}, tx: true, want: completed},
			{h: handled{status: 302}, want: completed},
			{h: handled{status: 400}, want: completed},
			{h: handled{status: 404}, profile: ProfileStripe, want: completed},
			{h: handled{status: 409}, tx: true, want: completed},
			{h: handled{status: 422}, profile: ProfileAppstrate, want: completed},
			{h: handled{status: 499}, want: completed},
		}},
		{"5xx, 408, 425, 429 release the key, so a retry re-executes", []tc{
			{h: handled{status: 500}, want: released},
			{h: handled{status: 503}, profile: ProfileAppstrate, want: released},
			{h: handled{status: 599}, want: released},
			{h: handled{status: 408}, want: released},
			{h: handled{status: 425}, want: released},
			{h: handled{status: 429}, want: released},
			{h: handled{status: 429}, profile: ProfileStripe, want: released},
			{h: handled{status: 500}, tx: true, want: releasedTx},
			{h: handled{status: 429}, tx: true, want: releasedTx},
			{h: handled{status: 500, streamed: true}, want: released},
		}},
		{"a handler that knows its effect may already have happened marks the outcome unknown instead", []tc{
			{h: handled{status: 500, unknown: true}, want: unknown},
			{h: handled{status: 502, unknown: true}, profile: ProfileStripe, want: unknown},
			{h: handled{status: 200, unknown: true}, want: unknown},
			{h: handled{status: 503, unknown: true}, tx: true, want: unknownTx},
		}},
		{"the Stripe profile stores 5xx once the handler ran", []tc{
			{h: handled{status: 500}, profile: ProfileStripe, want: completed},
			{h: handled{status: 503}, profile: ProfileStripe, want: completed},
			// Not in transactional mode: a 5xx rolls the business
			// transaction back whatever the profile, and a completion
			// cannot commit without it.
			{h: handled{status: 500}, profile: ProfileStripe, tx: true, want: releasedTx},
		}},
		{"a rejection made before any effect: the record is dropped, not stored", []tc{
			{h: handled{status: 400, rejected: true}, want: dropped},
			{h: handled{status: 403, rejected: true}, profile: ProfileStripe, want: dropped},
			{h: handled{status: 422, rejected: true}, tx: true, want: droppedTx},
			{h: handled{status: 400, rejected: true, unknown: true}, want: dropped},
		}},
		{"a Guard's function that returns an error is taken to have had no effect, as a 5xx: the key is released", []tc{
			{h: handled{failed: true}, want: released},
			{h: handled{failed: true}, profile: ProfileStripe, want: released},
			{h: handled{failed: true}, tx: true, want: releasedTx},
			{h: handled{failed: true, streamed: true}, want: released},
			{h: handled{failed: true, unknown: true}, want: unknown},
			{h: handled{failed: true, rejected: true}, want: dropped},
		}},
		{"a panic marks unknown (or released in transactional mode, where the transaction rolled back)", []tc{
			{h: handled{panicked: true}, want: unknown},
			{h: handled{panicked: true}, profile: ProfileStripe, want: unknown},
			{h: handled{panicked: true, rejected: true}, want: unknown},
			{h: handled{panicked: true}, tx: true, want: releasedTx},
			{h: handled{panicked: true, unknown: true}, tx: true, want: releasedTx},
		}},
		{"a response over the limit, or one the handler streamed, is marked so a retry gets 409 not-replayable", []tc{
			{h: handled{status: 200, streamed: true}, want: notReplayable},
			{h: handled{status: 404, streamed: true}, tx: true, want: notReplayable},
			{h: handled{status: 500, streamed: true}, profile: ProfileStripe, want: notReplayable},
		}},
	}
	for _, row := range rows {
		t.Run(row.spec, func(t *testing.T) {
			t.Parallel()
			for _, c := range row.cases {
				if c.profile == "" {
					c.profile = ProfileIETF
				}
				got := afterHandler(c.h, c.profile, c.tx)
				if got != c.want {
					t.Errorf("afterHandler(%+v, %s, transactional=%v) = %s, want %s", c.h, c.profile, c.tx, got, c.want)
				}
			}
		})
	}
}

func (o outcome) String() string {
	names := [...]string{"completed", "not-replayable", "released", "unknown", "dropped"}
	s := fmt.Sprint(o.record)
	if int(o.record) < len(names) {
		s = names[o.record]
	}
	if o.rollback {
		s += " after rollback"
	}
	return s
}
