// Package chaos is a fault campaign against `idem proxy`, in the manner of
// Jepsen: concurrent clients send operations through three proxies sharing
// one store, a seeded schedule injects faults (processes killed and
// stopped, the store crashed, failed over or cut off, a slow upstream, lost
// responses), every attempt and every execution upstream is recorded, and
// once the faults stop and the reconciler has had its time the whole
// history is checked against the contract.
//
// The checker (Check) looks at each key on its own:
//
//   - the upstream ran it at most once, except after an execution that the
//     upstream itself answered with a status that releases the key (its
//     5xx: nothing applied) and that had ended. A reconciliation lookup
//     answering 404 proves that nothing had run when it answered; an
//     attempt sent before it that reaches the upstream after it is a
//     double execution, not a release (the pause defect);
//   - every 2xx a client got carries the key's one execution id: a fresh
//     answer its own attempt's execution, a replay the original answer;
//   - no acknowledged answer is lost: the final record replays it;
//   - no record is left unknown once the reconciler could answer;
//   - the key's history is linearizable against a model of SPEC sections 2
//     and 3 (model.go), checked with porcupine; a failure leaves porcupine's
//     HTML visualization of the key next to the campaign's log.
//
// The campaign itself runs in this package's tests: see campaign_test.go.
package chaos
