package cli

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmaint"
	"github.com/idem-dev/idem/idemmem"
)

func TestOpsMetricsAndConsole(t *testing.T) {
	t.Parallel()
	store := idemmem.New(nil)
	token := strings.Repeat("s", 32)
	o, err := newOps(&opsOptions{consoleToken: token}, opsParts{Store: store, Maintainer: idemmaint.New(store, nil)})
	if err != nil {
		t.Fatal(err)
	}
	app := idem.New(store, &idem.Config{Metrics: o.Metrics})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	for range 2 {
		r := httptest.NewRequest("POST", "/pay", nil)
		r.Header.Set("Idempotency-Key", "k1")
		app.ServeHTTP(httptest.NewRecorder(), r)
	}
	get := func(path, auth string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", path, nil)
		if auth != "" {
			r.Header.Set("Authorization", "Bearer "+auth)
		}
		w := httptest.NewRecorder()
		o.Handler.ServeHTTP(w, r)
		return w
	}
	w := get("/metrics", "")
	body, _ := io.ReadAll(w.Body)
	for _, want := range []string{`decision="created"`, `decision="replayed"`, "idem_unknown_backlog", "go_goroutines"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if w := get("/_idem/", ""); w.Code != http.StatusUnauthorized {
		t.Fatalf("console without a token: %d", w.Code)
	}
	if w := get("/_idem/", token); w.Code != http.StatusOK {
		t.Fatalf("console with the token: %d", w.Code)
	}
}

func TestOpsConsoleOffWithoutToken(t *testing.T) {
	t.Parallel()
	o, err := newOps(&opsOptions{}, opsParts{Store: idemmem.New(nil)})
	if err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	o.Handler.ServeHTTP(w, httptest.NewRequest("GET", "/_idem/", nil))
	if w.Code != http.StatusNotFound {
		t.Fatalf("console without --console-token: %d, want 404", w.Code)
	}
	if _, err := newOps(&opsOptions{consoleToken: "short"}, opsParts{Store: idemmem.New(nil)}); err == nil {
		t.Fatal("a short console token was accepted")
	}
}
