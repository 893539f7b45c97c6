package idemredis

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// defaultMaxBatches is Config.MaxBatches's default.
const defaultMaxBatches = 2

// batcher sends the scripts of concurrent calls together: at most max
// batches are in flight; a call that comes while they are all in flight
// queues, and the next batch sends everything queued as one pipeline, in
// one round trip. Redis then reads and answers the queued calls with one
// read and one write instead of one each, and the client spends one
// connection's round trip on them: most of the CPU time of a short script,
// on both sides, is that I/O. Nothing waits for a batch to fill: a call
// that finds a batch free is sent at once, alone.
//
// Each call keeps its own command and error, in its order on the
// connection; a pipeline does not make the calls a transaction.
type batcher struct {
	mu     sync.Mutex
	queue  []*batchCall
	spare  []*batchCall // the previous queue's array, for reuse
	active int          // batches in flight, or about to be
	max    int
	// leading is set while a queued call was told to send the next batch
	// and has not taken the queue yet: nobody else is told.
	leading bool
}

// batchCall is one queued call. wake is signalled once: when cmd has its
// reply, or when lead is set (the caller then sends the next batch).
type batchCall struct {
	cmd  redis.Cmder
	wake chan struct{}
	lead bool
}

var batchCalls = sync.Pool{New: func() any { return &batchCall{wake: make(chan struct{}, 1)} }}

// process sends cmd on client, in a batch with the calls queued meanwhile,
// and returns when it has its reply.
func (b *batcher) process(ctx context.Context, client redis.UniversalClient, cmd redis.Cmder) {
	if err := ctx.Err(); err != nil {
		cmd.SetErr(err)
		return
	}
	b.mu.Lock()
	if b.active < b.max && len(b.queue) == 0 {
		b.active++
		b.mu.Unlock()
		_ = client.Process(ctx, cmd)
		b.next()
		return
	}
	c := batchCalls.Get().(*batchCall)
	c.cmd, c.lead = cmd, false
	b.queue = append(b.queue, c)
	if b.active < b.max && !b.leading {
		// A batch is free but calls queued before this one wait for it:
		// send them all now.
		b.active++
		b.leading, c.lead = true, true
		c.wake <- struct{}{}
	}
	b.mu.Unlock()
	<-c.wake
	lead := c.lead
	// The reply is in cmd; c may go back to the pool once it leaves the
	// queue (a leader takes the queue before it sends it).
	if lead {
		b.send(ctx, client)
		b.next()
	}
	c.cmd = nil
	batchCalls.Put(c)
}

// send sends the queued calls as one pipeline and wakes their callers.
// The batch belongs to the caller that sends it; it runs on a context
// without its cancellation, since other callers' commands are in it (as
// go-redis does by default, a call's I/O is bounded by the client's read
// and write timeouts, not by its context).
func (b *batcher) send(ctx context.Context, client redis.UniversalClient) {
	b.mu.Lock()
	q := b.queue
	b.queue, b.spare = b.spare[:0], nil
	b.leading = false
	b.mu.Unlock()
	if len(q) == 0 {
		return
	}
	bctx := context.WithoutCancel(ctx)
	if len(q) == 1 {
		_ = client.Process(bctx, q[0].cmd)
	} else {
		pipe := client.Pipeline()
		for _, c := range q {
			_ = pipe.Process(bctx, c.cmd)
		}
		_, _ = pipe.Exec(bctx) // errors are read per command
	}
	for i, c := range q {
		if !c.lead {
			c.wake <- struct{}{}
		}
		q[i] = nil
	}
	b.mu.Lock()
	if b.spare == nil {
		b.spare = q[:0]
	}
	b.mu.Unlock()
}

// next hands the batch its caller held to the first queued call, or frees
// it when nothing is queued or a queued call already leads.
func (b *batcher) next() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.queue) == 0 || b.leading {
		b.active--
		return
	}
	c := b.queue[0]
	b.leading, c.lead = true, true
	c.wake <- struct{}{}
}
