package idemredis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemstore"
)

// TestBatchedCalls runs many calls at once through one store, whose
// batcher sends them in shared round trips: each gets its own reply, and
// a call whose context is done fails without being sent.
func TestBatchedCalls(t *testing.T) {
	ctx := t.Context()
	client := sharedClient(t)
	pipes := &pipelineSizes{}
	client.AddHook(pipes)
	s := newTestStore(t, client, time.Now)
	if s.batch == nil {
		t.Fatal("a store on a *redis.Client does not batch")
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				id := idemstore.Identity{Scope: "s", Endpoint: "POST /x", Key: fmt.Sprintf("batch-%d-%d", g, i)}
				token := id.Key
				res, err := s.KeyReserve(ctx, &idemstore.ReserveParams{Identity: id, Fingerprint: "fp", Token: token, Lease: time.Minute, TTL: time.Hour})
				if err != nil || !res.Reserved || res.Record.Token != token {
					errs <- fmt.Errorf("KeyReserve %s = %+v, %v", id.Key, res, err)
					return
				}
				resp := &idemstore.Response{Status: 200 + g, Body: []byte(id.Key)}
				if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: id, Token: token, Response: resp}); err != nil {
					errs <- fmt.Errorf("KeyComplete %s: %v", id.Key, err)
					return
				}
				res, err = s.KeyReserve(ctx, &idemstore.ReserveParams{Identity: id, Fingerprint: "fp", Token: "other", Lease: time.Minute, TTL: time.Hour})
				if err != nil || res.Reserved || res.Record.Response == nil ||
					res.Record.Response.Status != 200+g || string(res.Record.Response.Body) != id.Key {
					errs <- fmt.Errorf("replay of %s = %+v, %v", id.Key, res, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := pipes.largest(); n < 2 {
		t.Errorf("64 goroutines' calls never shared a round trip: the largest pipeline held %d", n)
	}
	s.batch.mu.Lock()
	active, queued := s.batch.active, len(s.batch.queue)
	s.batch.mu.Unlock()
	if active != 0 || queued != 0 {
		t.Errorf("after the calls: %d batches in flight, %d calls queued", active, queued)
	}

	done, cancel := context.WithCancel(ctx)
	cancel()
	id := idemstore.Identity{Scope: "s", Endpoint: "POST /x", Key: "batch-cancelled"}
	if _, err := s.KeyReserve(done, &idemstore.ReserveParams{Identity: id, Fingerprint: "fp", Token: "t", Lease: time.Minute, TTL: time.Hour}); err == nil {
		t.Error("KeyReserve with a cancelled context succeeded")
	}
	if _, err := s.KeyGet(ctx, id); !errors.Is(err, idemstore.ErrNotFound) {
		t.Errorf("KeyGet after a cancelled reservation = %v, want ErrNotFound", err)
	}
}

// pipelineSizes is a redis.Hook that keeps the size of the largest
// pipeline sent, a new connection's handshake left out.
type pipelineSizes struct {
	mu  sync.Mutex
	max int
}

func (p *pipelineSizes) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (p *pipelineSizes) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (p *pipelineSizes) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		n := 0
		for _, cmd := range cmds {
			switch cmd.Name() {
			case "hello", "client", "auth", "select": // a connection's handshake
			default:
				n++
			}
		}
		p.mu.Lock()
		p.max = max(p.max, n)
		p.mu.Unlock()
		return next(ctx, cmds)
	}
}

func (p *pipelineSizes) largest() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.max
}
