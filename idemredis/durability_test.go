package idemredis

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv/redisproc"
)

// The tests of this file are the rows of the README's "What each store can
// lose" table for Redis: each completes keys, makes Redis fail one way,
// and counts the completed keys whose retry would run the operation again.

const durabilityKeys = 40

// completeKeys reserves and completes durabilityKeys keys through s.
func completeKeys(t *testing.T, s *Store) {
	t.Helper()
	ctx := t.Context()
	for i := range durabilityKeys {
		id := idemstore.Identity{Scope: "s", Endpoint: "POST /pay", Key: fmt.Sprintf("k%d", i)}
		res, err := s.KeyReserve(ctx, &idemstore.ReserveParams{Identity: id, Fingerprint: "fp", Token: "t1",
			Lease: time.Minute, TTL: time.Hour, LeaseExpiredState: idemstore.StateUnknown})
		if err != nil || !res.Reserved {
			t.Fatalf("reserving %s: %+v, %v", id.Key, res, err)
		}
		if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: id, Token: "t1",
			Response: &idemstore.Response{Status: 201, Body: []byte(id.Key)}}); err != nil {
			t.Fatalf("completing %s: %v", id.Key, err)
		}
	}
}

// secondExecutions retries every key through s and counts those the store
// lets run again: their completion was lost.
func secondExecutions(t *testing.T, s *Store) int {
	t.Helper()
	ctx := t.Context()
	n := 0
	for i := range durabilityKeys {
		id := idemstore.Identity{Scope: "s", Endpoint: "POST /pay", Key: fmt.Sprintf("k%d", i)}
		var res *idemstore.ReserveResult
		// The restarted server may still be loading its file.
		deadline := time.Now().Add(20 * time.Second)
		for {
			var err error
			res, err = s.KeyReserve(ctx, &idemstore.ReserveParams{Identity: id, Fingerprint: "fp", Token: "t2",
				Lease: time.Minute, TTL: time.Hour, LeaseExpiredState: idemstore.StateUnknown})
			if err == nil {
				break
			}
			if !redis.HasErrorPrefix(err, "LOADING") || time.Now().After(deadline) {
				t.Fatalf("retrying %s: %v", id.Key, err)
			}
			time.Sleep(50 * time.Millisecond) // the server loads on real time
		}
		switch {
		case res.Reserved:
			n++
		case res.Record.State != idemstore.StateCompleted || string(res.Record.Response.Body) != id.Key:
			t.Errorf("%s after the failure: %+v; want its completion or nothing", id.Key, res.Record)
		}
	}
	return n
}

func storeOn(t *testing.T, srv *redisproc.Server, cfg *Config) *Store {
	t.Helper()
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	return New(client, cfg)
}

// TestDurabilityNoPersistence: a master without persistence killed and
// restarted has lost every completion: every retry runs again.
func TestDurabilityNoPersistence(t *testing.T) {
	t.Parallel()
	srv := redisproc.Start(t)
	s := storeOn(t, srv, nil)
	completeKeys(t, s)
	srv.Kill()
	srv.Restart()
	if n := secondExecutions(t, s); n != durabilityKeys {
		t.Fatalf("%d of %d keys would run again after the restart; want all (nothing persisted)", n, durabilityKeys)
	}
}

// TestDurabilityAOFAlways: with appendfsync always, a master killed
// (SIGKILL) and restarted replays every completion.
func TestDurabilityAOFAlways(t *testing.T) {
	t.Parallel()
	srv := redisproc.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	s := storeOn(t, srv, nil)
	completeKeys(t, s)
	srv.Kill()
	srv.Restart()
	if n := secondExecutions(t, s); n != 0 {
		t.Fatalf("%d of %d keys would run again after the restart; want none", n, durabilityKeys)
	}
}

// TestDurabilityAsyncReplicaFailover: replication is asynchronous. With the
// replica cut off, completions the master acknowledged are lost
// when the master dies and the replica is promoted: every retry runs again.
func TestDurabilityAsyncReplicaFailover(t *testing.T) {
	t.Parallel()
	master, replica := redisproc.Start(t), redisproc.Start(t)
	replica.ReplicaOf(master)
	s := storeOn(t, master, nil)
	// A partition: the replica stops, the master drops its link (what was
	// already in flight on it, the replica reads when it resumes).
	replica.Freeze()
	if err := master.Client().ClientKillByFilter(t.Context(), "TYPE", "replica").Err(); err != nil {
		t.Fatal(err)
	}
	completeKeys(t, s) // acknowledged without the replica
	master.Kill()
	replica.Thaw()
	replica.Promote()
	if n := secondExecutions(t, storeOn(t, replica, nil)); n != durabilityKeys {
		t.Fatalf("%d of %d keys would run again on the promoted replica; want all", n, durabilityKeys)
	}
}

// TestDurabilityWaitReplicas: with WaitReplicas 1 every call returns only
// once the replica has its write, so a failover to it loses nothing; and
// while the replica does not acknowledge, a reservation fails closed
// (ErrNotReplicated) within WaitTimeout instead of answering.
func TestDurabilityWaitReplicas(t *testing.T) {
	t.Parallel()
	master, replica := redisproc.Start(t), redisproc.Start(t)
	replica.ReplicaOf(master)
	s := storeOn(t, master, &Config{WaitReplicas: 1, WaitTimeout: 300 * time.Millisecond})

	replica.Freeze()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	start := time.Now()
	_, err := s.KeyReserve(ctx, &idemstore.ReserveParams{Identity: idemstore.Identity{Scope: "s", Endpoint: "POST /pay", Key: "frozen"},
		Fingerprint: "fp", Token: "t", Lease: time.Minute, TTL: time.Hour})
	took := time.Since(start)
	replica.Thaw()
	if !errors.Is(err, ErrNotReplicated) {
		t.Fatalf("reserving while the replica is frozen: %v; want ErrNotReplicated", err)
	}
	if took < 300*time.Millisecond || took > 4*time.Second {
		t.Errorf("the refusal took %v; want about the wait timeout (300ms)", took)
	}
	// The thawed replica acknowledges again, before the writes that need
	// it (on a loaded machine it took longer than the wait timeout).
	mc := master.Client()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if n, err := mc.Wait(t.Context(), 1, time.Second).Result(); err == nil && n >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the thawed replica acknowledges no write within 10s")
		}
	}

	completeKeys(t, s)
	master.Kill()
	replica.Promote()
	if n := secondExecutions(t, storeOn(t, replica, nil)); n != 0 {
		t.Fatalf("%d of %d keys would run again on the promoted replica; want none", n, durabilityKeys)
	}
}

// TestWaitReplicasCluster runs WaitReplicas on the test cluster, whose
// masters have no replica: every write, whichever master holds its slot,
// fails closed with ErrNotReplicated.
func TestWaitReplicasCluster(t *testing.T) {
	t.Parallel()
	client := clusterClient(t)
	s := New(client, &Config{Prefix: newTestStore(t, client, time.Now).prefix, WaitReplicas: 1, WaitTimeout: 50 * time.Millisecond})
	for i := range 5 {
		_, err := s.KeyReserve(t.Context(), &idemstore.ReserveParams{Identity: idemstore.Identity{Scope: "s", Endpoint: "e", Key: fmt.Sprint(i)},
			Fingerprint: "fp", Token: "t", Lease: time.Minute, TTL: time.Hour})
		if !errors.Is(err, ErrNotReplicated) {
			t.Fatalf("reserve %d without replicas: %v; want ErrNotReplicated", i, err)
		}
	}
}
