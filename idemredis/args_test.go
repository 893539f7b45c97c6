package idemredis

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// luaHeader returns how many keys and arguments a script's header comment
// says it takes ("KEYS: see record_keys." is all five).
func luaHeader(t *testing.T, name string) (keys, args int) {
	t.Helper()
	src, err := luaFiles.ReadFile("lua/" + name)
	if err != nil {
		t.Fatal(err)
	}
	var header strings.Builder
	for _, line := range strings.Split(string(src), "\n") {
		if !strings.HasPrefix(line, "--") {
			break
		}
		header.WriteString(line + "\n")
	}
	maxIndex := func(re string) int {
		n := 0
		for _, m := range regexp.MustCompile(re).FindAllStringSubmatch(header.String(), -1) {
			i, _ := strconv.Atoi(m[1])
			n = max(n, i)
		}
		return n
	}
	keys = maxIndex(`KEYS\[(\d+)\]`)
	if strings.Contains(header.String(), "KEYS: see record_keys") {
		keys = 5
	}
	return keys, maxIndex(`ARGV\[(\d+)\]`)
}

// TestArgsMatchScripts checks each builder against its script's header: the
// number of keys and arguments, the record as the first key (run routes
// WAIT by it), one hash tag for all keys (Cluster), and a command built
// at its final size (one allocation).
func TestArgsMatchScripts(t *testing.T) {
	t.Parallel()
	s := New(nil, nil)
	k := s.keysOf(testID)
	resp, err := encodeResponse(benchResponse, false)
	if err != nil {
		t.Fatal(err)
	}
	calls := []struct {
		script string
		call   []any
	}{
		{"reserve.lua", reserveArgs{allKeys: true, redisTTL: 1, expiryScore: 2}.call(k.boxed)},
		{"complete.lua", completeArgs{resp: resp, allKeys: true}.call(k.boxed)},
		{"release.lua", finishArgs{}.call(k.boxed)},
		{"mark_unknown.lua", finishArgs{}.call(k.boxed)},
		{"delete.lua", finishArgs{}.deleteCall(k.boxed)},
		{"renew.lua", renewArgs{}.call(k.boxed)},
		{"resolve.lua", resolveArgs{resp: resp}.call(k.boxed)},
		{"reseal.lua", resealArgs{resp: resp}.call(k.boxed)},
		{"purge.lua", purgeArgs{}.call(k.boxed)},
		{"reconcile_fail.lua", reconcileFailArgs{}.call(k.boxed)},
		{"wait.lua", waitArgs{}.call(k.boxed)},
	}
	// The shorter calls of a new key (two keys for reserve.lua, three for
	// complete.lua, fewer arguments for a lease that expires into
	// unknown), at their final size too.
	for _, c := range []struct {
		call []any
		keys int
	}{
		{reserveArgs{}.call(k.boxed), 2}, {reserveArgs{redisTTL: 1}.call(k.boxed), 2},
		{completeArgs{resp: resp}.call(k.boxed), 3}, {completeArgs{proof: "p"}.call(k.boxed), 3},
	} {
		if len(c.call) != cap(c.call) || c.call[2] != any(c.keys) || c.call[3] != any(k.record) {
			t.Errorf("short call %v: %d elements in room for %d, want %d keys", c.call, len(c.call), cap(c.call), c.keys)
		}
	}
	tag := k.record[:strings.IndexByte(k.record, '}')+1]
	for _, c := range calls {
		wantKeys, wantArgs := luaHeader(t, c.script)
		if len(c.call) != cap(c.call) {
			t.Errorf("%s: command of %d elements in room for %d", c.script, len(c.call), cap(c.call))
		}
		n, ok := c.call[2].(int)
		if !ok || n != wantKeys {
			t.Errorf("%s: %v keys, want %d", c.script, c.call[2], wantKeys)
			continue
		}
		if got := len(c.call) - 3 - n; got != wantArgs {
			t.Errorf("%s: %d arguments, want %d", c.script, got, wantArgs)
		}
		if c.call[3] != any(k.record) {
			t.Errorf("%s: first key %v, want the record %s", c.script, c.call[3], k.record)
		}
		for _, key := range c.call[3 : 3+n] {
			if !strings.HasPrefix(key.(string), tag) {
				t.Errorf("%s: key %v outside the record's hash tag %s", c.script, key, tag)
			}
		}
	}
	for name, build := range map[string]func(recordKeys) ([]string, []any){
		"sweep.lua":           indexArgs{}.keysArgs,
		"reap.lua":            indexArgs{}.keysArgs,
		"reconcile_claim.lua": claimArgs{}.keysArgs,
	} {
		wantKeys, wantArgs := luaHeader(t, name)
		keys, args := build(s.bucketKeys(7, "m"))
		if len(keys) != wantKeys || len(args) != wantArgs {
			t.Errorf("%s: %d keys and %d arguments, want %d and %d", name, len(keys), len(args), wantKeys, wantArgs)
		}
	}
}
