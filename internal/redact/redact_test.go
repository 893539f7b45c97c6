package redact

import (
	"net/url"
	"strings"
	"testing"
)

var urlTests = []struct{ in, want string }{
	{"", ""},
	{"sqlite:./idem.db", "sqlite:./idem.db"},
	{"sqlite:///tmp/idem.db?synchronous=NORMAL", "sqlite:///tmp/idem.db?synchronous=NORMAL"},
	{"memory:", "memory:"},
	{"30s", "30s"},
	{"postgres://app:s3cret@db:5432/idem?sslmode=disable", "postgres://app:xxxxx@db:5432/idem?sslmode=disable"},
	{"postgres://app@db/idem?password=s3cret&sslpassword=k3y", "postgres://app@db/idem?password=xxxxx&sslpassword=xxxxx"},
	{"postgress://postgres:s3cret@127.0.0.1:5432/x", "postgress://postgres:xxxxx@127.0.0.1:5432/x"},
	{"mysql://root:s3cret@tcp(127.0.0.1:3306)/x", "mysql://root:xxxxx@tcp(127.0.0.1:3306)/x"},
	{"root:s3cret@tcp(127.0.0.1:3306)/x", "root:xxxxx@tcp(127.0.0.1:3306)/x"},
	{"redis+sentinel://:s3cret@h1:26379,h2:26379/0?master=m", "redis+sentinel://:xxxxx@h1:26379,h2:26379/0?master=m"},
	{"redis://:s3cret@127.0.0.1:badport/1", "redis://:xxxxx@127.0.0.1:badport/1"},
	{"redis://:s3cret@cache:6379/0", "redis://:xxxxx@cache:6379/0"},
	{"http://admin:s3cret@127.0.0.1:9000", "http://admin:xxxxx@127.0.0.1:9000"},
	{"http://upstream/x?api_key=s3cret&v=1", "http://upstream/x?api_key=xxxxx&v=1"},
	{"postgres://app:s3cret@db:badport\x7f/idem", "postgres://app:xxxxx@db:badport\x7f/idem"},
	{"postgres://app:s3/cr?et@db/idem", "postgres://app:xxxxx@db/idem"},
	{"postgres://app:s3cret@db/idem?sslmode=verify-full;password=k3y", "postgres://app:xxxxx@db/idem?sslmode=verify-full;password=xxxxx"},
	{"host=db password=s3cret", "host=db password=xxxxx"},
	{"host=db  password='s3 cret' user=app", "host=db  password=xxxxx user=app"},
	{"password=s3cret", "password=xxxxx"},
	{"user=app sslpassword=k3y dbname=x", "user=app sslpassword=xxxxx dbname=x"},
}

func TestURL(t *testing.T) {
	t.Parallel()
	for _, tt := range urlTests {
		got := URL(tt.in)
		if strings.Contains(got, "s3") || strings.Contains(got, "k3y") {
			t.Errorf("URL(%q) = %q leaks the secret", tt.in, got)
		}
		if got != tt.want {
			t.Errorf("URL(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// FuzzURL checks that a password the URL parser finds never survives.
func FuzzURL(f *testing.F) {
	for _, tt := range urlTests {
		f.Add(tt.in)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := URL(s)
		if URL(got) != got {
			t.Errorf("URL(%q) = %q is not stable: again %q", s, got, URL(got))
		}
		u, err := url.Parse(s)
		if err != nil || u.User == nil {
			return
		}
		pw, ok := u.User.Password()
		if !ok || len(pw) < 4 || strings.Contains(Mask, pw) {
			return
		}
		// The password as written (it may be escaped in s), unless the rest
		// of s holds the same text.
		auth := u.User.String() + "@"
		i := strings.Index(s, auth)
		if i < 0 {
			return // written in another form than String's
		}
		_, raw, _ := strings.Cut(u.User.String(), ":")
		if strings.Contains(got, raw) && !strings.Contains(s[:i]+s[i+len(auth):], raw) {
			t.Errorf("URL(%q) = %q keeps the password %q", s, got, raw)
		}
	})
}
