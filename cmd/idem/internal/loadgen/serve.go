package loadgen

import (
	"context"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// Listen listens on addr (TCP), and ends the process with the error if it
// cannot.
func Listen(addr string) net.Listener {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		log.Fatal(err)
	}
	return ln
}

// Serve serves h on ln until the process receives SIGINT or SIGTERM, and
// ends the process with the error if serving fails otherwise: the helper
// servers of the benchmarks (upstream, bareproxy, static) run this way.
func Serve(ln net.Listener, h http.Handler) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	if err := srv.Serve(ln); err != http.ErrServerClosed {
		log.Fatal(err)
	}
}
