package proxy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemprom"
	"github.com/idem-dev/idem/idemstore"
)

// benchBody is the request of scripts/bench/proxy.sh.
const benchBody = `{"customer_id":"cus_bench","amount_cents":1999,"currency":"EUR"}`

// benchKeys bounds the records of the memory store in the new-key
// benchmark: keys are reused in turns and the store's clock jumps past the
// TTL at every turn, so the store stays at benchKeys records (as a store
// with a reaper does) instead of growing with b.N.
const benchKeys = 10000

// benchUpstream answers as the end-to-end benchmark's upstream
// (cmd/idem/internal/loadgen/upstream): 201 and a JSON echo.
func benchUpstream(b *testing.B) *httptest.Server {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		out, _ := json.Marshal(struct {
			Method string          `json:"method"`
			Path   string          `json:"path"`
			Body   json.RawMessage `json:"body"`
		}{r.Method, r.URL.EscapedPath(), body})
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write(out)
	}))
	b.Cleanup(up.Close)
	return up
}

// benchRequest is a POST /v1/payments of benchBody with key.
func benchRequest(key string) *http.Request {
	r := httptest.NewRequest("POST", "/v1/payments", strings.NewReader(benchBody))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Idempotency-Key", key)
	return r
}

// BenchmarkProxy measures the proxy's work per request in one process,
// upstream included: bare is an httputil.ReverseProxy with the same
// transport settings (scripts/bench/proxy.sh's baseline), new and replay
// the proxy behind the idem middleware on the memory store, wired as `idem
// proxy` wires it (Prometheus metrics, the endpoint by escaped path).
func BenchmarkProxy(b *testing.B) {
	up := benchUpstream(b)
	target, err := url.Parse(up.URL)
	if err != nil {
		b.Fatal(err)
	}
	newIdem := func(up *httptest.Server, store *idemmem.Store) http.Handler {
		target, err := url.Parse(up.URL)
		if err != nil {
			b.Fatal(err)
		}
		p := New(target, &Config{Logger: quietLogger()})
		b.Cleanup(p.CloseIdleConnections)
		return idem.New(store, &idem.Config{
			GuardConfig: idem.GuardConfig{Logger: quietLogger(), Metrics: idemprom.New(prometheus.NewRegistry(), nil)},

			Endpoint: idem.EscapedPathEndpoint(),
		})(p)
	}
	b.Run("bare", func(b *testing.B) {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = 256
		t.MaxIdleConns = 1024
		b.Cleanup(t.CloseIdleConnections)
		h := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(target) }, Transport: t}
		b.ReportAllocs()
		for b.Loop() {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, benchRequest("k"))
			if w.Code != http.StatusCreated {
				b.Fatal(w.Code, w.Body)
			}
		}
	})
	// newKeys runs first requests through h, with n keys in turns; the
	// memory store's clock is turn's.
	newKeys := func(b *testing.B, h http.Handler, turn *int, n int) {
		keys := make([]string, min(b.N, n))
		for i := range keys {
			keys[i] = "key-" + strconv.Itoa(i)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			k := i % n
			if i > 0 && k == 0 {
				*turn++ // the records of the previous turn expire
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, benchRequest(keys[k]))
			if w.Code != http.StatusCreated || w.Header().Get(idem.HeaderReplayed) != "" {
				b.Fatal(w.Code, w.Body)
			}
		}
	}
	epoch := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clocked := func(turn *int) *idemmem.Store {
		return idemmem.New(&idemmem.Config{Now: func() time.Time { return epoch.Add(time.Duration(*turn) * 25 * time.Hour) }})
	}
	b.Run("new", func(b *testing.B) {
		turn := 0
		newKeys(b, newIdem(up, clocked(&turn)), &turn, benchKeys)
	})
	b.Run("new-64KiB", func(b *testing.B) {
		// A larger answer, which arrives in several reads; fewer keys, so
		// that the store's records stay at 32 MiB.
		large := bytes.Repeat([]byte("x"), 64<<10)
		big := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Header().Set("Content-Length", strconv.Itoa(len(large)))
			w.WriteHeader(http.StatusCreated)
			w.Write(large)
		}))
		b.Cleanup(big.Close)
		turn := 0
		newKeys(b, newIdem(big, clocked(&turn)), &turn, 500)
	})
	replay := func(b *testing.B, store *idemmem.Store) {
		h := newIdem(up, store)
		h.ServeHTTP(httptest.NewRecorder(), benchRequest("replayed"))
		// The request as a server reads it, from a reader used again (as
		// net/http's connection keeps its own), not httptest.NewRequest's
		// 4 KiB reader each time: the allocations are the server's and the
		// handler's.
		raw := "POST /v1/payments HTTP/1.1\r\nHost: idem\r\nContent-Type: application/json\r\n" +
			"Idempotency-Key: replayed\r\nContent-Length: " + strconv.Itoa(len(benchBody)) + "\r\n\r\n" + benchBody
		src := strings.NewReader(raw)
		br := bufio.NewReader(src)
		runtime.GC() // the store's records are the live heap, not the filling's garbage
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			src.Reset(raw)
			br.Reset(src)
			r, err := http.ReadRequest(br)
			if err != nil {
				b.Fatal(err)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != http.StatusCreated || w.Header().Get(idem.HeaderReplayed) != "true" {
				b.Fatal(w.Code, w.Body)
			}
		}
	}
	b.Run("replay", func(b *testing.B) {
		h := newIdem(up, idemmem.New(nil))
		h.ServeHTTP(httptest.NewRecorder(), benchRequest("replayed"))
		b.ReportAllocs()
		for b.Loop() {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, benchRequest("replayed"))
			if w.Code != http.StatusCreated || w.Header().Get(idem.HeaderReplayed) != "true" {
				b.Fatal(w.Code, w.Body)
			}
		}
	})
	b.Run("replay-200k", func(b *testing.B) {
		// A replay in a store of many completed records, as a proxy's
		// memory store is after a while of new keys: the garbage
		// collector marks them all on every cycle, which the requests'
		// allocations drive.
		replay(b, filledStore(b, 200000))
	})
}

// filledStore returns a memory store holding n completed records of other
// keys, with the response the benchmark's upstream gives (as the proxy
// stores it).
func filledStore(b *testing.B, n int) *idemmem.Store {
	store := idemmem.New(nil)
	ctx := b.Context()
	body := []byte(`{"method":"POST","path":"/v1/payments","body":` + benchBody + "}\n")
	for i := range n {
		id := idemstore.Identity{Endpoint: "POST /v1/payments", Key: "filled-" + strconv.Itoa(i)}
		token := "token-" + strconv.Itoa(i)
		fp := fmt.Sprintf("%064x", i) // as long as a fingerprint
		if _, err := store.KeyReserve(ctx, &idemstore.ReserveParams{Identity: id, Fingerprint: fp, Token: token, Lease: time.Minute, TTL: 24 * time.Hour}); err != nil {
			b.Fatal(err)
		}
		resp := &idemstore.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: body}
		if err := store.KeyComplete(ctx, &idemstore.CompleteParams{Identity: id, Token: token, Response: resp}); err != nil {
			b.Fatal(err)
		}
	}
	return store
}
