package provider

import (
	"errors"
	"net"
	"net/http"
	"time"
)

// Server is a Provider listening on a TCP address.
type Server struct {
	*Provider
	srv  *http.Server
	ln   net.Listener
	done chan struct{}
}

// Listen opens the provider (see New) and serves it on addr, e.g.
// "127.0.0.1:8081" (port 0 picks a free one), until Close.
func Listen(addr string, cfg *Config) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return Serve(ln, cfg)
}

// Serve opens the provider (see New) and serves it on ln until Close. It
// closes ln when the provider cannot be opened. A caller that needs the
// provider's URL before its store is open (to open another store first)
// listens itself and calls Serve.
func Serve(ln net.Listener, cfg *Config) (*Server, error) {
	p, err := New(cfg)
	if err != nil {
		ln.Close()
		return nil, err
	}
	s := &Server{
		Provider: p,
		srv: &http.Server{
			Handler:           p,
			ReadHeaderTimeout: 10 * time.Second,
		},
		ln:   ln,
		done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			p.log.Error("provider: serving failed", "error", err)
		}
	}()
	p.log.Info("provider: listening", "addr", ln.Addr().String())
	return s, nil
}

// Addr returns the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// URL returns the server's base URL, e.g. "http://127.0.0.1:8081".
func (s *Server) URL() string { return "http://" + s.Addr() }

// Close stops listening, closes every connection (held ones included),
// waits for the handlers and closes the store. It is safe to call twice.
func (s *Server) Close() error {
	err := s.srv.Close()
	<-s.done
	return errors.Join(err, s.Provider.Close())
}
