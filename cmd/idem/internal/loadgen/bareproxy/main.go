// Command bareproxy is the baseline of the end-to-end benchmark
// (scripts/bench/proxy.sh): a bare httputil.ReverseProxy in front of the
// upstream, with nothing else, so that what `idem proxy` adds is measured
// against the cost of the forwarding hop itself.
//
//	go run ./cmd/idem/internal/loadgen/bareproxy --listen 127.0.0.1:9001 --upstream http://127.0.0.1:9000
//
// --transport tuned (the default) gives it idem proxy's transport settings;
// --transport default leaves httputil.ReverseProxy on http.DefaultTransport,
// as a reverse proxy written without tuning has it (the baseline issue 16's
// first figures were measured against).
package main

import (
	"context"
	"flag"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:9001", "`ADDR` to serve on")
	upstream := flag.String("upstream", "http://127.0.0.1:9000", "`URL` to forward to")
	transport := flag.String("transport", "tuned", "`KIND` of transport: tuned (idem proxy's settings) or default (http.DefaultTransport)")
	flag.Parse()
	target, err := url.Parse(*upstream)
	if err != nil || target.Host == "" {
		log.Fatalf("--upstream %q: want an http URL", *upstream)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	// The same transport as idem proxy's: http.DefaultTransport keeps only
	// two idle connections per host, which would make the baseline open a
	// connection for most requests under load.
	var t http.RoundTripper
	switch *transport {
	case "tuned":
		tt := http.DefaultTransport.(*http.Transport).Clone()
		tt.MaxIdleConnsPerHost = 256
		tt.MaxIdleConns = 1024
		t = tt
	case "default":
		t = http.DefaultTransport
	default:
		log.Fatalf("--transport %q: want tuned or default", *transport)
	}
	rp := &httputil.ReverseProxy{
		Rewrite:   func(r *httputil.ProxyRequest) { r.SetURL(target) },
		Transport: t,
	}
	srv := &http.Server{Handler: rp, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	log.Printf("bare proxy listening on %s, forwarding to %s", ln.Addr(), target)
	if err := srv.Serve(ln); err != http.ErrServerClosed {
		log.Fatal(err)
	}
}
