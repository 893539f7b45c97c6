package idemredis

import (
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
)

func loadScript(name string) *redis.Script {
	lib, err := luaFiles.ReadFile("lua/lib.lua")
	if err != nil {
		panic(err)
	}
	src, err := luaFiles.ReadFile("lua/" + name)
	if err != nil {
		panic(err)
	}
	return redis.NewScript(string(lib) + "\n" + string(src))
}
