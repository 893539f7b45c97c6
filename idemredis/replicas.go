package idemredis

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNotReplicated is wrapped by the error of a call whose write did not
// reach Config.WaitReplicas replicas within Config.WaitTimeout. The write
// was made on the master: the call fails closed (the middleware answers
// 503 and runs nothing), and the record stays as the master has it.
var ErrNotReplicated = errors.New("idemredis: the write was not acknowledged by enough replicas")

// defaultWaitTimeout is Config.WaitTimeout's default.
const defaultWaitTimeout = time.Second

// processWaited sends cmd (a script that writes the record key) and then
// WAIT on the same connection, in one round trip, and fails cmd with
// ErrNotReplicated when fewer than s.waitReplicas replicas acknowledged
// the write within s.waitTimeout. WAIT counts the writes of its own
// connection: on a cluster the pipeline goes to the master of key's slot.
func (s *Store) processWaited(ctx context.Context, cmd *redis.Cmd, key string) {
	var pipe redis.Pipeliner
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		master, err := c.MasterForKey(ctx, key)
		if err != nil {
			cmd.SetErr(err)
			return
		}
		pipe = master.Pipeline()
	case *redis.Client:
		pipe = c.Pipeline()
	default:
		cmd.SetErr(fmt.Errorf("idemredis: WaitReplicas needs a *redis.Client or a *redis.ClusterClient, not a %T", s.client))
		return
	}
	_ = pipe.Process(ctx, cmd)
	wait := pipe.Do(ctx, "wait", s.waitReplicas, s.waitTimeout.Milliseconds())
	_, _ = pipe.Exec(ctx) // errors are read per command
	if cmd.Err() != nil {
		if _, moved := redis.IsMovedError(cmd.Err()); moved {
			// The slot moved since the client read the cluster's layout:
			// read it again before retrySlot sends the call again.
			if c, ok := s.client.(*redis.ClusterClient); ok {
				c.ReloadState(ctx)
			}
		}
		return
	}
	acks, err := wait.Int()
	switch {
	case err != nil:
		cmd.SetErr(fmt.Errorf("%w: WAIT: %v", ErrNotReplicated, err))
	case acks < s.waitReplicas:
		cmd.SetErr(fmt.Errorf("%w: %d of %d replicas within %v", ErrNotReplicated, acks, s.waitReplicas, s.waitTimeout))
	}
}
