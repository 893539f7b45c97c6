// Package console is idem's operator console: a small server-rendered web
// application, mounted by the commands under /_idem/ and off unless they are
// given a console token.
//
// Pages: an overview (records by state, bounded counts; decision totals and
// rates; the maintainer's and the outbox's figures), the unknown queue, a
// key's full record with its resolve actions, and the outbox with its dead
// letters and a retry action. Everything is html/template output with inline
// CSS: no build step, no JavaScript.
//
// Security:
//
//   - Every request is authenticated, with the token in an
//     "Authorization: Bearer" header or with the session cookie the login
//     form sets. The cookie holds a random session id (32 bytes) that the
//     console keeps, as a hash, with its expiry (Config.SessionTTL): every
//     login gets its own, and a logout revokes it, so a copy of the cookie
//     stops working. It is HttpOnly, SameSite=Strict, scoped to the
//     console's path, and Secure over TLS, behind a proxy that says the
//     client used TLS (X-Forwarded-Proto, Forwarded) or with
//     Config.SecureCookie. Sessions live in the process that issued them
//     (a restart signs everyone out). Comparisons are constant-time, and
//     failed logins are rate limited.
//   - Every POST carries a CSRF token derived (HMAC) from the session and is
//     checked, as are Origin and Sec-Fetch-Site when the browser sends them
//     (net/http.CrossOriginProtection).
//   - Idempotency keys never appear in URLs (which end up in access logs and
//     Referer headers): links carry a reference sealed with AES-GCM under a
//     key derived from the token. Keys are shown to the authenticated
//     operator, but logs name records by key_hash only, the hash the
//     middleware and the maintainer log.
//   - Operator actions (resolve, retry) are written to the logger as audit
//     lines with the action, the key_hash and the state change. A resolution
//     is fenced on the record's token as read when the page was rendered, so
//     acting on a stale page fails instead of overwriting a newer outcome.
//   - Responses carry a strict Content-Security-Policy, no-store caching,
//     no-referrer and frame denial.
package console
