// Package idemnats processes NATS JetStream messages at most once per
// message id, on idem's core (idem.Guard) and any idem store.
//
// JetStream delivers at least once: a consumer that crashes, or acks too
// late, gets the message again, and a producer that retries after its
// stream's duplicate window publishes it twice. A Consumer wraps a message
// handler so that each message id runs it at most once. The id is the
// Nats-Msg-Id header by default (Config.MessageID picks another); the record
// lives at endpoint "nats STREAM/CONSUMER" (Config.Endpoint), which is what
// idem keys and the console show; the fingerprint is the message's subject
// and data, so the same id on another message is refused, never replayed.
//
// What becomes of each delivery:
//
//   - A new id runs the handler under the record's lease. When it returns
//     nil the outcome is stored first and the message acked afterwards: an
//     ack never gets ahead of the record. When it returns an error the key
//     is released (in transactional mode the transaction rolls back) and the
//     message nak'ed with a delay that grows with its deliveries
//     (Config.ErrorDelay), so it is redelivered and runs again, and a
//     message that always fails does not spin. While the handler runs,
//     each renewal of the record's lease tells JetStream the message is in
//     progress (InProgress), so a handler longer than AckWait keeps it.
//   - A completed id (a redelivery, or a duplicate published after the
//     duplicate window) is acked without running the handler.
//   - An id in progress elsewhere (another consumer still runs it) is nak'ed
//     with a delay: the core's estimate of the remaining work.
//   - An id whose outcome is unknown (its consumer crashed or lost its lease
//     mid-message, outside transactional mode) is never run again. By
//     default the message is nak'ed with Config.HoldDelay: it stays
//     un-acked, counted in the consumer's pending and redelivered acks,
//     logged as a warning at every delivery and counted as
//     idem.DecisionUnknown in Metrics; once reconciliation or an operator
//     settles the record (idem keys resolve), the next delivery acks it
//     (completed) or runs it (released). Config.Unknown = Term terminates
//     it instead, for those who handle JetStream's MSG_TERMINATED advisory.
//   - An id whose stored outcome fails verification
//     (idem.ErrResponseUntrusted: it does not authenticate, or encryption
//     is required and it is not sealed) is never run again either: it is
//     held as Config.Unknown says and logged as an error
//     (OutcomeUntrusted), until an operator settles the record.
//   - A message without an id is held the same way (nak'ed with HoldDelay)
//     by default: the safe choice that neither runs it unprotected nor
//     drops it. Config.MissingID chooses Term or RunUnprotected.
//   - The store unavailable: nak with a delay; the handler does not run
//     (fail closed).
//   - The same id on another message (other subject or data): Term, logged
//     as an error; retrying cannot help.
//
// In transactional mode (Config.Guard.Transactional on idemsqlite,
// idempgx or idemmysql), the handler's database writes go through the driver's
// TxFromContext and commit in one transaction with the record's
// completion: both or neither. A consumer killed mid-message then leaves
// nothing behind, its lease expires to released, and the redelivery runs
// the message again.
//
// The at-most-once promise is the store's: it holds across processes and
// machines sharing a store. JetStream's own guarantees stay as configured:
// a consumer's MaxDeliver bounds the redeliveries of held messages too
// (leave it unlimited, the default, or set it knowingly). When it is set,
// give the Consumer the same number (Config.MaxDeliver): on that last
// delivery a message that would be nak'ed is terminated instead, logged as
// an error and counted (OutcomeMaxDeliveries, TermMetrics), rather than
// dropped by JetStream without a word; with Config.Conn the termination
// carries its reason on servers that read it. The consumer's AckWait
// should exceed the lease's heartbeat (Lease/3, 10 s by default), or the
// message is redelivered to another consumer while it runs (which is
// safe: that one finds the id in progress and naks with a delay).
package idemnats
