// Package idemamqp processes RabbitMQ messages at most once per message id,
// on idem's core (idem.Guard) and any idem store. It is idemnats's sibling
// for AMQP 0-9-1 (github.com/rabbitmq/amqp091-go).
//
// RabbitMQ delivers at least once: a consumer that dies, or loses its
// channel, before it acks gets the message back, and a producer that
// retries a publish whose confirm it missed stores it twice. A Consumer
// wraps a message handler so that each message id runs it at most once.
// The id is the message's message-id property by default (Config.MessageID
// reads another, Header a header you name); the record lives at endpoint
// "amqp QUEUE" (Config.Endpoint), which idem keys and the console show; the
// fingerprint is the message's routing key (as first published) and body,
// so the same id on another message is refused, never replayed.
//
// # Queues
//
// A Consumer works on three queues, which Declare creates (on RabbitMQ 3.10
// or later: quorum queues with at-least-once dead-lettering and message
// TTL):
//
//   - QUEUE, the work queue: a quorum queue with x-delivery-limit
//     (Config.DeliveryLimit) that dead-letters at least once to QUEUE.dead.
//     A message the broker has returned more often than the limit (its
//     handler keeps failing, its consumer keeps dying) is dead-lettered by
//     the broker with the x-death reason delivery_limit: never dropped.
//   - QUEUE.delay (Config.DelayQueue), the retry queue: a quorum queue
//     without consumers whose messages, each with a per-message TTL
//     (expiration), dead-letter back to QUEUE. A message that cannot be
//     processed now is copied there with its delay and then acked, so it
//     comes back after the delay without holding a prefetch slot or
//     blocking the channel meanwhile. Messages expire in queue order: one
//     behind a longer delay waits for it.
//   - QUEUE.dead (Config.DeadLetterQueue): the messages given up, by the
//     broker (x-death reason delivery_limit) or by the Consumer, which adds
//     the header x-idem-outcome with its reason (key_reused,
//     delivery_limit, and unknown, untrusted or missing_id when Config
//     says so).
//
// A copy keeps the message's properties, body and headers; it carries its
// first routing key in x-idem-routing-key and the returns counted so far in
// x-idem-returns, since the broker's x-delivery-count starts again on a
// copy. Every copy is published with publisher confirms, and the original
// is acked only once the broker confirmed the copy; a copy that could not
// be published leaves the original requeued instead.
//
// # What becomes of each delivery
//
//   - A new id runs the handler under the record's lease. When it returns
//     nil the outcome is stored first and the message acked afterwards: an
//     ack never gets ahead of the record. When it returns an error the key
//     is released (in transactional mode the transaction rolls back) and the
//     message requeued (basic.nack with requeue), so it runs again; each
//     requeue counts toward the delivery limit.
//   - A completed id (a redelivery, or a duplicate published later) is
//     acked without running the handler.
//   - An id in progress elsewhere (another consumer still runs it, or a dead
//     one's lease lasts) goes to the delay queue with the core's estimate of
//     the remaining work (Config.RetryDelay overrides).
//   - An id whose outcome is unknown (its consumer died or lost its lease
//     mid-message, outside transactional mode) is never run again. By
//     default it is held: copied to the delay queue with Config.HoldDelay,
//     again at every return, logged as a warning each time (with the number
//     of holds so far, from x-death) and counted as idem.DecisionUnknown in
//     Metrics; once reconciliation or an operator settles the record (idem
//     keys resolve), the next delivery acks it (completed) or runs it
//     (released). Config.Unknown = DeadLetter sends it to the dead-letter
//     queue instead.
//   - An id whose stored outcome fails verification
//     (idem.ErrResponseUntrusted: it does not authenticate, or encryption
//     is required and it is not sealed) is never run again either: it is
//     held or dead-lettered as Config.Unknown says and logged as an error
//     (OutcomeUntrusted), until an operator settles the record.
//   - A message without an id is held the same way by default: the safe
//     choice that neither runs it unprotected nor drops it.
//     Config.MissingID chooses DeadLetter or RunUnprotected.
//   - The store unavailable, a per-scope limit: the delay queue; the handler
//     does not run (fail closed).
//   - The same id on another message: dead-lettered, logged as an error;
//     retrying cannot help.
//   - A message whose returns (x-delivery-count with x-idem-returns) exceed
//     Config.DeliveryLimit: dead-lettered, whatever its record says.
//
// In transactional mode (Config.Guard.Transactional on idemsqlite,
// idempgx or idemmysql), the handler's database writes go through the
// driver's TxFromContext and commit in one transaction with the record's
// completion: both or neither. A consumer killed mid-message then leaves
// nothing behind, its lease expires to released, and the redelivery runs
// the message again.
//
// The at-most-once promise is the store's: it holds across processes and
// machines sharing a store. A completed record expires with its retention
// (Config.Guard.TTL, 24 hours by default); a copy of the message published
// after that runs again, so keep the retention longer than any producer
// may republish, or make the effect itself refuse a second copy (a unique
// event id in the business table).
package idemamqp
