package idempgx

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-dev/idem/idemstore"
)

// Reconnection delays of the notifier after its connection failed.
const (
	minListenBackoff = 100 * time.Millisecond
	maxListenBackoff = 5 * time.Second
)

// notifyChannel is the store's notification channel: one per schema, short
// enough for PostgreSQL's 63-byte identifiers whatever the schema's name.
func notifyChannel(schema string) string {
	h := fnv.New64a()
	h.Write([]byte(schema))
	return "idem_keys_" + strconv.FormatUint(h.Sum64(), 16)
}

// notifyPayload is the notification payload for id, the same hash the
// statements compute (notifyPayloadSQL). Collisions only cause spurious
// wake-ups.
func notifyPayload(id idemstore.Identity) string {
	sum := md5.Sum(fmt.Appendf(nil, "%d:%s%d:%s%s",
		len(id.Scope), id.Scope, len(id.Endpoint), id.Endpoint, id.Key))
	return hex.EncodeToString(sum[:])
}

// KeyWait returns when the record identified by id may have changed: at
// once when it is not in progress, else when the attempt's outcome is
// written (a notification on the store's channel), at the latest after
// Config.WaitPoll, or with ctx's error.
//
// The first call starts a goroutine that listens on a dedicated connection
// (made with the pool's connection settings) and fans notifications out to
// the waiting calls; Close stops it. A waiting call marks the record, and
// only the statements finishing a marked record send a notification, so
// requests that nobody waits for never pay for NOTIFY. A record whose lease
// expires without a write, or lapses on another request's KeyReserve, wakes
// its waiters at the next poll.
func (s *Store) KeyWait(ctx context.Context, id idemstore.Identity) error {
	poll := time.NewTimer(s.cfg.WaitPoll)
	defer poll.Stop()
	n := s.notify
	ready, ok := n.start()
	if !ok { // closed: poll only
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-poll.C:
			return nil
		}
	}
	select {
	case <-ready:
	case <-ctx.Done():
		return ctx.Err()
	case <-poll.C:
		return nil
	}

	w := n.register(notifyPayload(id))
	defer n.unregister(w)
	var inProgress bool
	if err := s.pool.QueryRow(ctx, s.q.wait, id.Scope, id.Endpoint, id.Key, s.now()).Scan(&inProgress); err != nil {
		return fmt.Errorf("waiting for key: %w", interpretError(err))
	}
	if !inProgress {
		return nil
	}
	select {
	case <-w.wake:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-poll.C:
		return nil
	}
}

// Close stops the listener that KeyWait starts and closes its connection.
// It does not close the pool. Close is safe to call more than once; KeyWait
// after Close only polls.
func (s *Store) Close() {
	s.notify.stop()
}

// notifier listens on the store's channel and wakes the waiters of the
// records named by the notifications.
type notifier struct {
	s *Store

	mu      sync.Mutex
	started bool
	closed  bool
	cancel  context.CancelFunc
	done    chan struct{} // closed when run returns
	ready   chan struct{} // closed at the first LISTEN
	waiters map[string]map[*waiter]struct{}
}

// waiter is one waiting KeyWait call.
type waiter struct {
	payload string
	wake    chan struct{} // buffered, 1
}

func newNotifier(s *Store) *notifier {
	return &notifier{
		s:       s,
		done:    make(chan struct{}),
		ready:   make(chan struct{}),
		waiters: make(map[string]map[*waiter]struct{}),
	}
}

// start starts the listener once and returns the channel closed when it
// first listens; ok is false after stop.
func (n *notifier) start() (ready <-chan struct{}, ok bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, false
	}
	if !n.started {
		n.started = true
		ctx, cancel := context.WithCancel(context.Background())
		n.cancel = cancel
		go n.run(ctx)
	}
	return n.ready, true
}

// stop stops the listener and waits for it. It is safe to call twice.
func (n *notifier) stop() {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return
	}
	n.closed = true
	started := n.started
	if started {
		n.cancel()
	}
	n.mu.Unlock()
	if started {
		<-n.done
	}
}

func (n *notifier) register(payload string) *waiter {
	w := &waiter{payload: payload, wake: make(chan struct{}, 1)}
	n.mu.Lock()
	defer n.mu.Unlock()
	set := n.waiters[payload]
	if set == nil {
		set = make(map[*waiter]struct{})
		n.waiters[payload] = set
	}
	set[w] = struct{}{}
	return w
}

func (n *notifier) unregister(w *waiter) {
	n.mu.Lock()
	defer n.mu.Unlock()
	set := n.waiters[w.payload]
	delete(set, w)
	if len(set) == 0 {
		delete(n.waiters, w.payload)
	}
}

// wake wakes the waiters of payload, or every waiter when payload is "".
func (n *notifier) wake(payload string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for p, set := range n.waiters {
		if payload != "" && p != payload {
			continue
		}
		for w := range set {
			select {
			case w.wake <- struct{}{}:
			default:
			}
		}
	}
}

// run listens until ctx ends, reconnecting with backoff.
func (n *notifier) run(ctx context.Context) {
	defer close(n.done)
	var once sync.Once
	backoff := minListenBackoff
	for {
		err := n.listen(ctx, func() {
			once.Do(func() { close(n.ready) })
			backoff = minListenBackoff
			// Notifications sent while no connection listened are lost:
			// every waiter reads its record again.
			n.wake("")
		})
		if ctx.Err() != nil {
			return
		}
		n.s.cfg.Logger.Warn("idempgx: notification listener failed; waiters fall back to polling",
			"error", err, "retry_in", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, maxListenBackoff)
	}
}

// listen connects, listens on the channel, calls listening and delivers
// notifications until the connection fails or ctx ends.
func (n *notifier) listen(ctx context.Context, listening func()) error {
	conn, err := pgx.ConnectConfig(ctx, n.s.pool.Config().ConnConfig)
	if err != nil {
		return err
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		conn.Close(closeCtx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{n.s.channel}.Sanitize()); err != nil {
		return err
	}
	listening()
	for {
		nt, err := conn.WaitForNotification(ctx)
		if err != nil {
			if errors.Is(err, context.Canceled) && ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		n.wake(nt.Payload)
	}
}
