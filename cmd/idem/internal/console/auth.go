package console

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// cookieName is the session cookie's name.
const cookieName = "idem_console"

// keys are the secrets derived from the console token. The token itself is
// kept only as the HMAC it must match.
type keys struct {
	compare []byte // HMAC key for comparing tokens in constant time
	want    []byte // HMAC(compare, token)
	csrf    []byte // HMAC key of the CSRF tokens
	ref     cipher.AEAD
}

// deriveKeys derives every console secret from token, each under its own
// label.
func deriveKeys(token string) keys {
	derive := func(label string) []byte {
		h := hmac.New(sha256.New, []byte(token))
		h.Write([]byte("idem-console/" + label))
		return h.Sum(nil)
	}
	k := keys{compare: derive("compare"), csrf: derive("csrf")}
	k.want = mac(k.compare, token)
	block, err := aes.NewCipher(derive("ref")) // 32 bytes: AES-256
	if err != nil {
		panic("console: " + err.Error()) // unreachable: the key size is fixed
	}
	if k.ref, err = cipher.NewGCM(block); err != nil {
		panic("console: " + err.Error())
	}
	return k
}

// mac returns HMAC-SHA256(key, msg).
func mac(key []byte, msg string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(msg))
	return h.Sum(nil)
}

// checkToken reports, in constant time, whether got is the console token.
func (k *keys) checkToken(got string) bool {
	return hmac.Equal(mac(k.compare, got), k.want)
}

// maxSessions bounds the sessions a console keeps; past it, a login ends
// the session closest to its expiry.
const maxSessions = 1024

// sessions are the live sessions: each a random cookie value, kept here as
// its SHA-256 with its expiry, so a logout revokes one (and a restart, or a
// new token, all of them). A session belongs to the process that issued it.
type sessions struct {
	mu      sync.Mutex
	expires map[[sha256.Size]byte]time.Time
}

// issue returns the cookie value of a new session that lasts until expiry.
func (s *sessions) issue(now, expiry time.Time) string {
	var b [32]byte
	rand.Read(b[:]) // never fails (crypto/rand)
	value := base64.RawURLEncoding.EncodeToString(b[:])
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.expires == nil {
		s.expires = make(map[[sha256.Size]byte]time.Time)
	}
	for h, exp := range s.expires {
		if !now.Before(exp) {
			delete(s.expires, h)
		}
	}
	if len(s.expires) >= maxSessions {
		var first [sha256.Size]byte
		var firstExp time.Time
		for h, exp := range s.expires {
			if firstExp.IsZero() || exp.Before(firstExp) {
				first, firstExp = h, exp
			}
		}
		delete(s.expires, first)
	}
	s.expires[sha256.Sum256([]byte(value))] = expiry
	return value
}

// check reports whether v is the cookie value of a live session at now.
// The lookup is by hash, so its timing says nothing of the values held.
func (s *sessions) check(v string, now time.Time) bool {
	h := sha256.Sum256([]byte(v))
	s.mu.Lock()
	defer s.mu.Unlock()
	exp, ok := s.expires[h]
	if ok && !now.Before(exp) {
		delete(s.expires, h)
		return false
	}
	return ok
}

// revoke ends the session of cookie value v.
func (s *sessions) revoke(v string) {
	h := sha256.Sum256([]byte(v))
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.expires, h)
}

// csrfToken returns the CSRF token of a session.
func (k *keys) csrfToken(s *session) string {
	return base64.RawURLEncoding.EncodeToString(mac(k.csrf, s.id))
}

// checkCSRF reports, in constant time, whether got is the session's CSRF
// token.
func (k *keys) checkCSRF(s *session, got string) bool {
	return got != "" && hmac.Equal([]byte(got), []byte(k.csrfToken(s)))
}

// session is an authenticated operator.
type session struct {
	// id is what the CSRF token is derived from: the cookie value, or
	// "bearer" for a request authenticated by its Authorization header.
	id string
	// operator names the session in audit lines without revealing it.
	operator string
}

type sessionKey struct{}

// sessionFrom returns the request's session, set by ServeHTTP.
func sessionFrom(r *http.Request) *session {
	s, _ := r.Context().Value(sessionKey{}).(*session)
	return s
}

// authenticate checks the request's bearer token or, without an
// Authorization header, its session cookie. A request with a wrong bearer
// token fails even with a valid cookie.
func (c *console) authenticate(r *http.Request) (*session, bool) {
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, tok, ok := strings.Cut(h, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || !c.keys.checkToken(strings.TrimSpace(tok)) {
			return nil, false
		}
		return &session{id: "bearer", operator: "bearer"}, true
	}
	ck, err := r.Cookie(cookieName)
	if err != nil || !c.sessions.check(ck.Value, c.cfg.Now()) {
		return nil, false
	}
	sum := sha256.Sum256([]byte(ck.Value))
	return &session{id: ck.Value, operator: "session " + hex.EncodeToString(sum[:4])}, true
}

// login serves the login form (GET) and checks a login (POST), which sets
// the session cookie.
func (c *console) login(w http.ResponseWriter, r *http.Request) {
	next := c.safeNext(r.URL.Query().Get("next"))
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		if _, ok := c.authenticate(r); ok {
			http.Redirect(w, r, next, http.StatusSeeOther)
			return
		}
		c.renderLogin(w, r, http.StatusOK, next, "")
		return
	case http.MethodPost:
	default:
		w.Header().Set("Allow", "GET, HEAD, POST")
		c.renderError(w, r, http.StatusMethodNotAllowed, "Method not allowed", "The login accepts GET and POST.")
		return
	}
	if err := c.cop.Check(r); err != nil {
		c.forbidden(w, r, "This login came from another site.")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	if err := r.ParseForm(); err != nil {
		c.renderError(w, r, http.StatusBadRequest, "Bad request", "The form could not be read.")
		return
	}
	next = c.safeNext(r.PostForm.Get("next"))
	if ok, retry := c.failures.allowed(clientAddr(r.RemoteAddr), c.cfg.Now()); !ok {
		w.Header().Set("Retry-After", strconv.Itoa(retry))
		c.renderLogin(w, r, http.StatusTooManyRequests, next, "Too many failed logins: wait a minute.")
		return
	}
	if !c.keys.checkToken(r.PostForm.Get("token")) {
		c.authFailed(r, "form")
		c.unauthorizedLogin(w, r, next, "Wrong token.")
		return
	}
	now := c.cfg.Now()
	value := c.sessions.issue(now, now.Add(c.cfg.SessionTTL))
	http.SetCookie(w, &http.Cookie{
		Name:     cookieName,
		Value:    value,
		Path:     c.cfg.Prefix + "/",
		MaxAge:   int(c.cfg.SessionTTL / time.Second),
		HttpOnly: true,
		Secure:   c.secureCookie(r),
		SameSite: http.SameSiteStrictMode,
	})
	sum := sha256.Sum256([]byte(value))
	c.cfg.Logger.Info("idem console: login", slog.String("operator", "session "+hex.EncodeToString(sum[:4])),
		slog.String("remote_addr", r.RemoteAddr))
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// logout ends the request's session (a copy of its cookie no longer
// works) and clears the cookie.
func (c *console) logout(w http.ResponseWriter, r *http.Request) {
	if ck, err := r.Cookie(cookieName); err == nil && r.Header.Get("Authorization") == "" {
		c.sessions.revoke(ck.Value)
	}
	http.SetCookie(w, &http.Cookie{
		Name:     cookieName,
		Value:    "",
		Path:     c.cfg.Prefix + "/",
		MaxAge:   -1,
		HttpOnly: true,
		Secure:   c.secureCookie(r),
		SameSite: http.SameSiteStrictMode,
	})
	c.cfg.Logger.Info("idem console: logout", slog.String("operator", sessionFrom(r).operator))
	http.Redirect(w, r, c.cfg.Prefix+"/login", http.StatusSeeOther)
}

// secureCookie reports whether the session cookie set in answer to r is
// Secure: with Config.SecureCookie, when r came over TLS, and when a proxy
// in front says the client's request did (X-Forwarded-Proto: https, or
// Forwarded: proto=https). Trusting those headers costs nothing: a forged
// one only gets its sender a cookie its browser keeps off plain HTTP.
func (c *console) secureCookie(r *http.Request) bool {
	if c.cfg.SecureCookie || r.TLS != nil {
		return true
	}
	if proto, _, _ := strings.Cut(r.Header.Get("X-Forwarded-Proto"), ","); strings.EqualFold(strings.TrimSpace(proto), "https") {
		return true
	}
	// Forwarded (RFC 7239): the first element is the proxy nearest the
	// client.
	first, _, _ := strings.Cut(r.Header.Get("Forwarded"), ",")
	for pair := range strings.SplitSeq(first, ";") {
		name, value, _ := strings.Cut(strings.TrimSpace(pair), "=")
		if strings.EqualFold(name, "proto") && strings.EqualFold(strings.Trim(value, `"`), "https") {
			return true
		}
	}
	return false
}

// authFailed counts a failed authentication against the client's address
// and logs it, without the token tried. how is "form" or "bearer".
func (c *console) authFailed(r *http.Request, how string) {
	addr := clientAddr(r.RemoteAddr)
	n := c.failures.failed(addr, c.cfg.Now())
	c.cfg.Logger.Warn("idem console: authentication failed", slog.String("method", how),
		slog.String("remote_addr", r.RemoteAddr), slog.Int("failures_this_minute", n))
}

// safeNext returns next when it is a path inside the console, and the
// overview otherwise (no open redirect).
func (c *console) safeNext(next string) string {
	home := c.cfg.Prefix + "/"
	u, err := url.Parse(next)
	if err != nil || next == "" || u.Scheme != "" || u.Host != "" || u.User != nil ||
		!strings.HasPrefix(next, home) || strings.ContainsAny(next, "\\\r\n") || strings.HasPrefix(next, "//") {
		return home
	}
	return next
}

// unauthorized answers 401 with the login form, which returns to the
// requested page after the login.
func (c *console) unauthorized(w http.ResponseWriter, r *http.Request, msg string) {
	next := c.cfg.Prefix + "/"
	if r.Method == http.MethodGet {
		next = c.safeNext(r.URL.RequestURI())
	}
	c.unauthorizedLogin(w, r, next, msg)
}

func (c *console) unauthorizedLogin(w http.ResponseWriter, r *http.Request, next, msg string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="idem console"`)
	c.renderLogin(w, r, http.StatusUnauthorized, next, msg)
}

// forbidden answers 403: a failed CSRF or origin check.
func (c *console) forbidden(w http.ResponseWriter, r *http.Request, msg string) {
	c.cfg.Logger.Warn("idem console: request refused", slog.String("reason", msg),
		slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.String("remote_addr", r.RemoteAddr))
	c.renderError(w, r, http.StatusForbidden, "Forbidden", msg)
}
