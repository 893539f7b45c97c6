// Command upstream is the trivial upstream of the README's proxy quick start
// and of the proxy benchmarks in BENCHMARKS.md: it answers every request 201
// with a JSON echo of what it received (method, path and body), so that a
// reader sees the proxy forwarded the request unchanged, and what `idem load`
// measures through `idem proxy` is the proxy and its store, not the API
// behind it.
//
//	go run ./internal/loadgen/upstream --listen 127.0.0.1:9000
package main

import (
	"encoding/json"
	"flag"
	"io"
	"log"
	"net/http"

	"github.com/idem-dev/idem/cmd/idem/internal/loadgen"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:9000", "`ADDR` to serve on")
	flag.Parse()
	ln := loadgen.Listen(*listen)
	log.Printf("upstream listening on %s", ln.Addr())
	loadgen.Serve(ln, http.HandlerFunc(answer))
}

// maxEcho bounds the body read and echoed.
const maxEcho = 1 << 20

// echo is the answer's JSON: the request as received. Body is the request's
// JSON body as it was sent, or, when it is not JSON, its text as a string.
type echo struct {
	Method string          `json:"method"`
	Path   string          `json:"path"`
	Body   json.RawMessage `json:"body"`
}

// answer is the upstream's only handler: 201 and the echo.
func answer(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxEcho))
	if err != nil {
		http.Error(w, "reading the body: "+err.Error(), http.StatusBadRequest)
		return
	}
	e := echo{Method: r.Method, Path: r.URL.EscapedPath(), Body: body}
	if len(body) == 0 {
		e.Body = json.RawMessage("null")
	} else if !json.Valid(body) {
		e.Body, _ = json.Marshal(string(body))
	}
	out, err := json.Marshal(e)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	w.Write(append(out, '\n'))
}
