// Command static is a ceiling of the end-to-end benchmark
// (scripts/bench/proxy.sh, BASELINES="static"): a net/http server that
// reads each request's body and answers 201 with one constant response, the
// bytes a replay of the benchmark's request carries (the upstream's echo of
// it, Content-Type and Idempotent-Replayed). It keeps no state and forwards
// nothing, so that no proxy answering from a store can be faster on this
// machine: what a replay costs beyond it is the lookup, the checks and the
// proxy's own plumbing.
//
//	go run ./cmd/idem/internal/loadgen/static --listen 127.0.0.1:9002
package main

import (
	"flag"
	"io"
	"log"
	"net/http"

	"github.com/idem-dev/idem/cmd/idem/internal/loadgen"
)

// body is the upstream's answer to the benchmark's request.
var body = []byte(`{"method":"POST","path":"/v1/payments","body":{"customer_id":"cus_bench","amount_cents":1999,"currency":"EUR"}}` + "\n")

func main() {
	listen := flag.String("listen", "127.0.0.1:9002", "`ADDR` to serve on")
	flag.Parse()
	ln := loadgen.Listen(*listen)
	log.Printf("static listening on %s", ln.Addr())
	loadgen.Serve(ln, http.HandlerFunc(answer))
}

// answer drains the request's body and writes the constant response.
func answer(w http.ResponseWriter, r *http.Request) {
	if _, err := io.Copy(io.Discard, r.Body); err != nil {
		http.Error(w, "reading the body: "+err.Error(), http.StatusBadRequest)
		return
	}
	h := w.Header()
	h["Content-Type"] = []string{"application/json"}
	h["Idempotent-Replayed"] = []string{"true"}
	w.WriteHeader(http.StatusCreated)
	w.Write(body)
}
