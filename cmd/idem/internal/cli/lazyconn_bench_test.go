package cli

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
)

// BenchmarkServeReplay serves replays over a loopback connection with
// keep-alive, as serveWith serves them, on a plain listener and on
// lazyListener: the client's work counts too, the same in both.
func BenchmarkServeReplay(b *testing.B) {
	for _, lazy := range []bool{false, true} {
		name := "plain"
		if lazy {
			name = "lazy"
		}
		b.Run(name, func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			h := idem.New(idemmem.New(nil), nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, `{"id":"pay_1","status":"created"}`)
			}))
			srv := &http.Server{
				Handler:           bodyDeadline(h, idem.DefaultBodyTimeout, func(*http.Request) bool { return true }),
				ReadHeaderTimeout: readHeaderTimeout,
				IdleTimeout:       idleTimeout,
				MaxHeaderBytes:    maxHeaderBytes,
			}
			var l net.Listener = ln
			if lazy {
				l = lazyListener{ln}
			}
			go srv.Serve(l)
			b.Cleanup(func() { srv.Close() })
			tr := &http.Transport{MaxIdleConnsPerHost: 1}
			b.Cleanup(tr.CloseIdleConnections)
			c := &http.Client{Transport: tr}
			url := "http://" + ln.Addr().String() + "/v1/payments"
			do := func() {
				req, _ := http.NewRequest("POST", url, strings.NewReader(`{"customer_id":"cus_bench","amount_cents":1999,"currency":"EUR"}`))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", "replayed")
				resp, err := c.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusCreated {
					b.Fatal(resp.Status)
				}
			}
			do()
			b.ReportAllocs()
			for b.Loop() {
				do()
			}
		})
	}
}
