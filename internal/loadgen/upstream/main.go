// Command upstream is the trivial upstream of the proxy benchmarks in
// BENCHMARKS.md: it reads the request body and answers every request 201
// with a small JSON body, so that what `idem load` measures through
// `idem proxy` is the proxy and its store, not the API behind it.
//
//	go run ./internal/loadgen/upstream --listen 127.0.0.1:9000
package main

import (
	"context"
	"flag"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:9000", "`ADDR` to serve on")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(answer), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	log.Printf("upstream listening on %s", ln.Addr())
	if err := srv.Serve(ln); err != http.ErrServerClosed {
		log.Fatal(err)
	}
}

// answer is the upstream's only handler.
func answer(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, `{"id":"pay_1","status":"pending","amount_cents":129900,"currency":"EUR"}`)
}
