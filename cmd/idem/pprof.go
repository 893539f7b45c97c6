//go:build pprof

// A profiling build for the benchmarks (BENCHMARKS.md, "Where the time
// goes"): `go build -tags pprof ./cmd/idem` serves net/http/pprof on
// IDEM_PPROF_ADDR (default 127.0.0.1:6060). Release builds leave it out.
package main

import (
	"log"
	"net/http"
	_ "net/http/pprof"
	"os"
)

func init() {
	addr := os.Getenv("IDEM_PPROF_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6060"
	}
	go func() { log.Println(http.ListenAndServe(addr, nil)) }()
}
