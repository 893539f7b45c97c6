package idemredis

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"strings"

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
// arguments, and the name of the same script in the function library.
type script struct {
	*redis.Script
	hash, src any
	function  any
	// noReplicaWait makes run skip Config.WaitReplicas for the script.
	noReplicaWait bool
}

func loadScript(name string) *script {
	all := string(readLua("lib.lua")) + "\n" + string(readLua(name))
	sc := redis.NewScript(all)
	return &script{Script: sc, hash: sc.Hash(), src: all, function: functionName(name)}
}

func readLua(name string) []byte {
	src, err := luaFiles.ReadFile("lua/" + name)
	if err != nil {
		panic(err)
	}
	return src
}

// library is every script of lua/ as one Redis 7 function library: a
// function (FCALL) does not run lib.lua again on every call as a script
// (EVALSHA) does, which costs a good part of a short script's time. Its
// name and its functions' names carry a digest of its code, so that stores
// of different versions of the package share a Redis without replacing
// each other's functions. Each function sets KEYS and ARGV, which the
// scripts and lib.lua read as a script's globals, and runs the script.
var libraryName, library = func() (string, string) {
	entries, err := luaFiles.ReadDir("lua")
	if err != nil {
		panic(err)
	}
	var funcs strings.Builder
	for _, e := range entries {
		if e.Name() == "lib.lua" {
			continue
		}
		fmt.Fprintf(&funcs, "redis.register_function('%%s%s', function(keys, args)\nKEYS, ARGV = keys, args\n%s\nend)\n",
			strings.TrimSuffix(e.Name(), ".lua"), readLua(e.Name()))
	}
	code := "local KEYS, ARGV\n" + string(readLua("lib.lua")) + "\n" + funcs.String()
	sum := sha256.Sum256([]byte(code))
	name := "idem_" + hex.EncodeToString(sum[:6])
	return name, "#!lua name=" + name + "\n" + strings.ReplaceAll(code, "'%s", "'"+name+"_")
}()

// functionName is the name of script file's function in library.
func functionName(file string) string {
	return libraryName + "_" + strings.TrimSuffix(file, ".lua")
}

// The command names and key counts, boxed once.
var (
	argEvalSha, argEval any = "evalsha", "eval"
	argFcall            any = "fcall"
	argGet              any = "get"
	argKeys1            any = 1
	argKeys2, argKeys3  any = 2, 3
	argKeys5            any = 5
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
		} else {
			s.process(ctx, cmd)
		}
		return cmd
	}
	return retrySlot(ctx, s, func() *redis.Cmd {
		if s.functions.Load() {
			cmd := send(argFcall, sc.function)
			err := cmd.Err()
			if err == nil || !isFunctionNotFound(err) && !redis.HasErrorPrefix(err, "OOM") &&
				!redis.HasErrorPrefix(err, "unknown command") && !redis.HasErrorPrefix(err, "NOPERM") {
				return cmd
			}
			if redis.HasErrorPrefix(err, "OOM") {
				// Above maxmemory Redis refuses a function that may write
				// before it runs, a script only when it writes: a replay
				// still reads its record.
				return s.runScript(send, sc)
			}
			if !s.loadFunctions(ctx, err) {
				// This server has no functions (before Redis 7), or no
				// permission to load them: scripts from now on.
				s.functions.Store(false)
			} else if cmd = send(argFcall, sc.function); !isFunctionNotFound(cmd.Err()) {
				return cmd
			}
		}
		return s.runScript(send, sc)
	})
}

// process sends cmd, in a round trip shared with concurrent calls where
// the store batches them (see batcher).
func (s *Store) process(ctx context.Context, cmd redis.Cmder) {
	if s.batch != nil {
		s.batch.process(ctx, s.client, cmd)
	} else {
		_ = s.client.Process(ctx, cmd)
	}
}

// runScript sends sc as a script: EVALSHA, then EVAL when the server does
// not know it.
func (s *Store) runScript(send func(name, script any) *redis.Cmd, sc *script) *redis.Cmd {
	cmd := send(argEvalSha, sc.hash)
	// (HasErrorPrefix allocates, even for no error.)
	if cmd.Err() != nil && redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		cmd = send(argEval, sc.src)
	}
	return cmd
}

// loadFunctions loads library into the server when err, the reply to an
// FCALL, says that it lacks it, and reports whether the FCALL may be sent
// again.
func (s *Store) loadFunctions(ctx context.Context, err error) bool {
	if !isFunctionNotFound(err) {
		return false
	}
	err = s.client.FunctionLoad(ctx, library).Err()
	return err == nil || redis.HasErrorPrefix(err, "Library '"+libraryName+"' already exists")
}

// isFunctionNotFound reports whether err is the reply to an FCALL of a
// function the server does not have.
func isFunctionNotFound(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "Function not found")
}
