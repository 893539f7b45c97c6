package idemredis

import (
	"context"
	"embed"

	"github.com/redis/go-redis/v9"
)

//go:embed lua/*.lua
var luaFiles embed.FS

// scripts are the Lua scripts of the store, each prefixed with lua/lib.lua.
// They run with EVALSHA (falling back to EVAL once per node after a restart
// or SCRIPT FLUSH).
var (
	reserveScript     = loadScript("reserve.lua")
	completeScript    = loadScript("complete.lua")
	releaseScript     = loadScript("release.lua")
	markUnknownScript = loadScript("mark_unknown.lua")
	deleteScript      = loadScript("delete.lua")
	renewScript       = loadScript("renew.lua")
	resolveScript     = loadScript("resolve.lua")
	sweepScript       = loadScript("sweep.lua")
	reapScript        = loadScript("reap.lua")
	purgeScript       = loadScript("purge.lua")
	claimScript       = loadScript("reconcile_claim.lua")
	failScript        = loadScript("reconcile_fail.lua")
	// waitScript's write (a waiter's registration) is not worth waiting
	// for replicas: a registration lost in a failover only makes the
	// waiter wake at the end of the lease instead of at the change.
	waitScript = func() *script { sc := loadScript("wait.lua"); sc.noReplicaWait = true; return sc }()
)

// script is a Lua script with its digest and source boxed once as command
// arguments.
type script struct {
	*redis.Script
	hash, src any
	// noReplicaWait makes run skip Config.WaitReplicas for the script.
	noReplicaWait bool
}

func loadScript(name string) *script {
	lib, err := luaFiles.ReadFile("lua/lib.lua")
	if err != nil {
		panic(err)
	}
	src, err := luaFiles.ReadFile("lua/" + name)
	if err != nil {
		panic(err)
	}
	all := string(lib) + "\n" + string(src)
	sc := redis.NewScript(all)
	return &script{Script: sc, hash: sc.Hash(), src: all}
}

// The command names and key counts, boxed once.
var (
	argEvalSha, argEval any = "evalsha", "eval"
	argKeys1            any = 1
	argKeys3, argKeys5  any = 3, 5
)

// newCall returns a command for run with room for n more elements (the
// number of keys, the keys and the arguments): its first two elements are
// left for run to fill in (command and script). The builders of args.go
// append the rest.
func newCall(n int) []any {
	return make([]any, 2, 2+n)
}

// run runs sc as Script.Run does (EVALSHA, then EVAL when the node does not
// know the script) with call, the command a builder of args.go made:
// command and script left for run to fill, the number of keys, the keys
// (the record's first), then the arguments. Building it in one slice of
// arguments that the caller boxed once (a record's key names are boxed when
// they are named, see recordKeys) spares the hot path most of the
// allocations of cmdable.EvalSha, which copies and boxes them all again.
//
// A call that meets a slot migration of a Redis Cluster is sent again until
// the context's deadline (see retrySlot). With Config.WaitReplicas, the call
// waits for the replicas' acknowledgement (see processWaited); otherwise it
// may share its round trip with concurrent calls (see batcher).
func (s *Store) run(ctx context.Context, sc *script, call []any) *redis.Cmd {
	send := func(name, script any) *redis.Cmd {
		call[0], call[1] = name, script
		cmd := redis.NewCmd(ctx, call...)
		cmd.SetFirstKeyPos(3)
		if s.waitReplicas > 0 && !sc.noReplicaWait {
			s.processWaited(ctx, cmd, call[3].(string))
		} else if s.batch != nil {
			s.batch.process(ctx, s.client, cmd)
		} else {
			_ = s.client.Process(ctx, cmd)
		}
		return cmd
	}
	return s.retrySlot(ctx, func() *redis.Cmd {
		cmd := send(argEvalSha, sc.hash)
		// (HasErrorPrefix allocates, even for no error.)
		if cmd.Err() != nil && redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			cmd = send(argEval, sc.src)
		}
		return cmd
	})
}
