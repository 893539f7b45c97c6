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
)

// script is a Lua script with its digest and source boxed once as command
// arguments.
type script struct {
	*redis.Script
	hash, src any
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
	argKeys2, argKeys3  any = 2, 3
	argKeys5            any = 5
)

// run runs sc as Script.Run does (EVALSHA, then EVAL when the node does not
// know the script) with the command built here: call is the whole command,
// its first three elements left for run to fill (command, script, number of
// keys), then nkeys keys, then the arguments. Building it in one slice of
// arguments that the caller boxed once (a record's key names are boxed when
// they are named, see recordKeys) spares the hot path most of the
// allocations of cmdable.EvalSha, which copies and boxes them all again.
//
// A call that meets a slot migration of a Redis Cluster is sent again until
// the context's deadline (see retrySlot). With Config.WaitReplicas, the call
// waits for the replicas' acknowledgement (see processWaited).
func (s *Store) run(ctx context.Context, sc *script, nkeys any, call []any) *redis.Cmd {
	send := func(name, script any) *redis.Cmd {
		call[0], call[1], call[2] = name, script, nkeys
		cmd := redis.NewCmd(ctx, call...)
		cmd.SetFirstKeyPos(3)
		if s.waitReplicas > 0 {
			s.processWaited(ctx, cmd, call[3].(string))
		} else {
			_ = s.client.Process(ctx, cmd)
		}
		return cmd
	}
	return s.retrySlot(ctx, func() *redis.Cmd {
		cmd := send(argEvalSha, sc.hash)
		if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			cmd = send(argEval, sc.src)
		}
		return cmd
	})
}
