package storeurl

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/redact"
)

// A query that does not parse cleanly is refused, naming the part, never
// half-applied: "sslmode=verify-full;" must not connect without
// verification, "schema=a;b" must not put the tables in public.
func TestOpenRefusesUnparsableQuery(t *testing.T) {
	t.Parallel()
	tests := []struct{ url, part string }{
		{"postgres://app:s3cret@127.0.0.1:5432/idem?sslmode=verify-full;", `"sslmode=verify-full;"`},
		{"postgres://app:s3cret@127.0.0.1:5432/idem?schema=a;b", `"schema=a;b"`},
		{"postgresql://127.0.0.1/idem?sslmode=require&schema=a%zz", `"schema=a%zz"`},
		{"postgres://127.0.0.1/idem?password=s3cret;x", `"password=xxxxx;x"`},
		{"redis://:s3cret@127.0.0.1:6379/0?prefix=a;b", `"prefix=a;b"`},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			s, closeStore, err := Open(ctx, tt.url)
			if err == nil {
				closeStore()
				t.Fatalf("Open(%q) = %v, want an error", tt.url, s)
			}
			if !strings.Contains(err.Error(), "query part "+tt.part) {
				t.Errorf("Open: %v, want it to name the query part %s", err, tt.part)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("Open: %v leaks the password", err)
			}
		})
	}
}

func TestParsePostgresKeepsAParsedQuery(t *testing.T) {
	t.Parallel()
	cfg, schema, err := ParsePostgres("postgres://app@127.0.0.1/idem?sslmode=verify-full&schema=tenant_a")
	if err != nil {
		t.Fatal(err)
	}
	if schema != "tenant_a" {
		t.Errorf("schema = %q, want tenant_a", schema)
	}
	if cfg.ConnConfig.TLSConfig == nil || cfg.ConnConfig.TLSConfig.InsecureSkipVerify {
		t.Errorf("sslmode=verify-full gave TLS config %+v, want verification", cfg.ConnConfig.TLSConfig)
	}
}

// FuzzParsePostgres: a URL whose query does not parse is refused, and no
// error shows the password.
func FuzzParsePostgres(f *testing.F) {
	for _, s := range []string{
		"postgres://app:s3cret@db:5432/idem?sslmode=disable",
		"postgres://app:s3cret@db/idem?sslmode=verify-full;",
		"postgres://db/idem?schema=a;b",
		"postgresql://app@db/idem?password=s3cret&schema=x",
		"postgres://app:s3cret@db:badport/idem",
		"postgres://db/idem?schema=%zz",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		_, schema, err := ParsePostgres(raw)
		if err != nil {
			// A password the URL parser finds, written plainly and nowhere
			// else in raw, is not in the error.
			u, perr := url.Parse(raw)
			if perr != nil || u.User == nil {
				return
			}
			pw, ok := u.User.Password()
			if !ok || len(pw) < 4 || strings.Count(raw, pw) != 1 || strings.Contains(redact.Mask, pw) ||
				!strings.Contains(raw, ":"+pw+"@") {
				return
			}
			if strings.Contains(err.Error(), pw) {
				t.Errorf("ParsePostgres(%q): %v leaks the password", raw, err)
			}
			return
		}
		if u, err := url.Parse(raw); err == nil && strings.Contains(u.RawQuery, ";") {
			t.Errorf("ParsePostgres(%q) accepted a query with ';' (schema %q)", raw, schema)
		}
	})
}

func TestParsePostgresPoolSize(t *testing.T) {
	t.Parallel()
	tests := []struct {
		url  string
		want int32
	}{
		{"postgres://app@127.0.0.1/idem", DefaultPostgresMaxConns},
		{"postgres://app@127.0.0.1/idem?schema=a", DefaultPostgresMaxConns},
		{"postgres://app@127.0.0.1/idem?pool_max_conns=3&schema=a", 3},
		{"postgres://app@127.0.0.1/idem?pool_max_conns=64", 64},
	}
	for _, tt := range tests {
		cfg, _, err := ParsePostgres(tt.url)
		if err != nil {
			t.Fatalf("ParsePostgres(%q): %v", tt.url, err)
		}
		if cfg.MaxConns != tt.want {
			t.Errorf("ParsePostgres(%q): MaxConns = %d, want %d", tt.url, cfg.MaxConns, tt.want)
		}
	}
}

func TestParsePostgresGroupCommit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		url  string
		want bool
	}{
		{"postgres://app@127.0.0.1/idem", true},
		{"postgres://app@127.0.0.1/idem?group_commit=true&schema=a", true},
		{"postgres://app@127.0.0.1/idem?group_commit=false", false},
		{"postgres://app@127.0.0.1/idem?group_commit=0&pool_max_conns=3", false},
	}
	for _, tt := range tests {
		cfg, opts, err := parsePostgres(tt.url)
		if err != nil {
			t.Fatalf("parsePostgres(%q): %v", tt.url, err)
		}
		if opts.groupCommit != tt.want {
			t.Errorf("parsePostgres(%q): group commit %v, want %v", tt.url, opts.groupCommit, tt.want)
		}
		if _, ok := cfg.ConnConfig.RuntimeParams["group_commit"]; ok {
			t.Errorf("parsePostgres(%q): group_commit sent to the server", tt.url)
		}
	}
	if _, _, err := parsePostgres("postgres://app@127.0.0.1/idem?group_commit=maybe"); err == nil {
		t.Error("group_commit=maybe accepted")
	}
}
