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
	"flag"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"

	"github.com/idem-dev/idem/cmd/idem/internal/loadgen"
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
	ln := loadgen.Listen(*listen)
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
	log.Printf("bare proxy listening on %s, forwarding to %s", ln.Addr(), target)
	loadgen.Serve(ln, rp)
}
