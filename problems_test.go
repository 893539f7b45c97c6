package idem_test

import (
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/idem-dev/idem"
)

// Problem "type" URIs lead to the README's table by default, and follow
// Config.ProblemBaseURI (or its former name) when set.
func TestProblemBaseURI(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  idem.Config
		want string
	}{
		{"default", idem.Config{}, "https://github.com/idem-dev/idem#problem-key-reused"},
		{"ProblemBaseURI", idem.Config{ProblemBaseURI: "https://api.example.com/problems/"}, "https://api.example.com/problems/key-reused"},
		{"ProblemTypeBase", idem.Config{ProblemTypeBase: "urn:old:"}, "urn:old:key-reused"},
		{"both", idem.Config{ProblemBaseURI: "urn:new:", ProblemTypeBase: "urn:old:"}, "urn:new:key-reused"},
	}
	for _, tt := range tests {
		b := setup(t, &tt.cfg, nil)
		b.do(t, http.MethodPost, "k", `{"a":1}`)
		w := b.do(t, http.MethodPost, "k", `{"a":2}`)
		if !strings.Contains(w.Body.String(), `"type":"`+tt.want+`"`) {
			t.Errorf("%s: problem %s, want type %s", tt.name, w.Body, tt.want)
		}
	}
}

// Every problem code the middleware answers has its anchor and its row in
// the README, where the default "type" URIs lead.
func TestREADMEDocumentsEveryProblem(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, code := range []string{
		idem.CodeKeyMissing, idem.CodeKeyInvalid, idem.CodeKeyReused, idem.CodeKeyInUse, idem.CodeOutcomeUnknown,
		idem.CodeNotReplayable, idem.CodeBodyTooLarge, idem.CodeStoreUnavailable, idem.CodeTooManyKeys,
		idem.CodeBodyUnreadable, idem.CodeBodyTimeout, idem.CodeConflict, idem.CodeUnauthorized,
		idem.CodeResponseUntrusted,
	} {
		anchor := strings.TrimPrefix(idem.DefaultProblemBaseURI, "https://github.com/idem-dev/idem#") + code
		if !strings.Contains(string(readme), `<a id="`+anchor+`"></a>`) {
			t.Errorf("README has no anchor %q for problem %s", anchor, code)
		}
	}
}

// The Appstrate profile covers every write by default; the others POST and
// PATCH. Methods, when set, wins.
func TestProfileMethods(t *testing.T) {
	t.Parallel()
	tests := []struct {
		cfg     idem.Config
		covered map[string]bool
	}{
		{idem.Config{}, map[string]bool{"POST": true, "PATCH": true, "PUT": false, "DELETE": false}},
		{idem.Config{Profile: idem.ProfileStripe}, map[string]bool{"POST": true, "PATCH": true, "PUT": false, "DELETE": false}},
		{idem.Config{Profile: idem.ProfileAppstrate}, map[string]bool{"POST": true, "PATCH": true, "PUT": true, "DELETE": true}},
		{idem.Config{Profile: idem.ProfileAppstrate, Methods: []string{"POST"}}, map[string]bool{"POST": true, "PUT": false, "DELETE": false}},
	}
	for _, tt := range tests {
		for method, want := range tt.covered {
			b := setup(t, &tt.cfg, nil)
			b.do(t, method, "k", `{"a":1}`)
			w := b.do(t, method, "k", `{"a":1}`)
			if got := w.Header().Get(idem.HeaderReplayed) == "true"; got != want {
				t.Errorf("profile %q methods %v: %s covered = %v, want %v", tt.cfg.Profile, tt.cfg.Methods, method, got, want)
			}
		}
	}
}
