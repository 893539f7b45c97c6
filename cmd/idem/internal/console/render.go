package console

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"strconv"
	"time"
)

//go:embed templates/*.html
var templateFS embed.FS

// css is the console's only style sheet, inlined in every page and allowed
// by its hash in the Content-Security-Policy.
const css = `
:root{--fg:#1d2430;--muted:#667085;--bg:#f6f7f9;--card:#fff;--line:#e3e6ea;--accent:#2856c7;--warn:#b54708;--warnbg:#fff6e6;--err:#b42318;--errbg:#fef3f2;--ok:#067647}
*{box-sizing:border-box}
body{margin:0;font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);background:var(--bg)}
header{display:flex;gap:1.5rem;align-items:center;padding:.7rem 1.5rem;background:#1d2430;color:#fff}
header a{color:#dfe6f5;text-decoration:none}
header a[aria-current]{color:#fff;border-bottom:2px solid #8fb0ff}
.brand{font-weight:700;color:#fff}
nav{display:flex;gap:1.1rem;flex:1}
main{padding:1rem 1.5rem;max-width:1200px}
h1{font-size:1.45rem;margin:.4rem 0 1rem}
h2{font-size:1.1rem;margin:0 0 .6rem}
h3{font-size:1rem;margin:0 0 .5rem}
a{color:var(--accent)}
.card{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:1rem;margin-bottom:1rem}
.narrow{max-width:24rem}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(260px,1fr));gap:1rem}
.grid .card{margin-bottom:0}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:.35rem .5rem;border-bottom:1px solid var(--line);vertical-align:top}
th{font-weight:600;color:var(--muted);font-size:.85rem}
.kv th{width:11rem}
.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.warn td,.warn{color:var(--warn);background:var(--warnbg)}
.list{background:var(--card);border:1px solid var(--line)}
code,pre{font:13px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;overflow-wrap:anywhere}
pre.body{white-space:pre-wrap;background:#f2f4f7;padding:.7rem;border-radius:6px;max-height:24rem;overflow:auto}
.key{font-family:ui-monospace,monospace;overflow-wrap:anywhere}
.payload{display:block;max-width:24rem;max-height:4.5rem;overflow:hidden}
.err{color:var(--err);max-width:20rem}
.muted{color:var(--muted);font-size:.88rem}
.error{color:var(--err);background:var(--errbg);border:1px solid #fecdca;padding:.6rem .8rem;border-radius:6px}
.flash{color:var(--ok);background:#ecfdf3;border:1px solid #abefc6;padding:.6rem .8rem;border-radius:6px}
.state{display:inline-block;padding:.05rem .5rem;border-radius:999px;font-size:.85rem;font-weight:600;background:#eef2f6}
.state.unknown{background:#fef0c7;color:var(--warn)}
.state.completed{background:#dcfae6;color:var(--ok)}
.state.in_progress{background:#dbe7ff;color:var(--accent)}
.filters a{margin-right:.6rem}
.filters a[aria-current]{font-weight:700;color:var(--fg);text-decoration:none}
label{display:block;font-weight:600;font-size:.88rem;margin:.6rem 0 .2rem}
label.check{font-weight:400}
input,textarea{font:inherit;padding:.4rem .5rem;border:1px solid #c9ced6;border-radius:6px;width:100%}
input[type=checkbox]{width:auto}
button{font:inherit;margin-top:.8rem;padding:.45rem 1rem;border:0;border-radius:6px;background:var(--accent);color:#fff;cursor:pointer}
button.secondary{background:#475467}
button.link{background:none;color:#dfe6f5;padding:0;margin:0}
.logout{margin:0}
.timeline{margin:0;padding-left:1.2rem}
.timeline time{font-variant-numeric:tabular-nums}
footer{padding:1rem 1.5rem;color:var(--muted);font-size:.8rem}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(380px,1fr));gap:1rem;margin-bottom:1rem}
.charts .card{margin-bottom:0}
.chart{margin:0}
.chart>svg{display:block}
.why{max-width:16rem;font-size:.88rem}
.legend{display:flex;flex-wrap:wrap;gap:.3rem .9rem;font-size:.82rem;color:var(--muted);margin-top:.3rem}
.legend b{color:var(--fg);font-weight:600}
`

// csp is the Content-Security-Policy of every response: nothing but the
// inline style sheet above, forms posting to the console itself, no
// framing and no scripts.
var csp = func() string {
	sum := sha256.Sum256([]byte(css))
	return "default-src 'none'; style-src 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) +
		"'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
}()

// templates holds one template set per page, each with the layout.
var templates = func() map[string]*template.Template {
	funcs := template.FuncMap{"css": func() template.CSS { return template.CSS(css) }}
	m := make(map[string]*template.Template)
	for _, name := range []string{"login", "error", "overview", "keys", "key", "outbox", "ledger"} {
		m[name] = template.Must(template.New(name).Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html"))
	}
	return m
}()

// page is what every template gets.
type page struct {
	Title  string
	Prefix string
	// CSRF is the session's CSRF token; empty for pages shown before
	// authentication (which then have no navigation).
	CSRF  string
	Nav   string
	Flash string
	Data  any
}

// render writes the named page with status. It renders into a buffer first,
// so a template error becomes a clean 500.
func (c *console) render(w http.ResponseWriter, r *http.Request, status int, name string, p page) {
	p.Prefix = c.cfg.Prefix
	if s := sessionFrom(r); s != nil {
		p.CSRF = c.keys.csrfToken(s)
	}
	var buf bytes.Buffer
	if err := templates[name].ExecuteTemplate(&buf, "layout", p); err != nil {
		c.cfg.Logger.Error("idem console: rendering a page failed", slog.String("page", name), slog.Any("error", err))
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		_, _ = w.Write(buf.Bytes())
	}
}

type loginData struct {
	Next    string
	Message string
}

func (c *console) renderLogin(w http.ResponseWriter, r *http.Request, status int, next, msg string) {
	c.render(w, r, status, "login", page{Title: "Sign in", Data: loginData{Next: next, Message: msg}})
}

type errorData struct {
	Message string
	Back    string
}

func (c *console) renderError(w http.ResponseWriter, r *http.Request, status int, title, msg string) {
	c.renderErrorBack(w, r, status, title, msg, "")
}

func (c *console) renderErrorBack(w http.ResponseWriter, r *http.Request, status int, title, msg, back string) {
	c.render(w, r, status, "error", page{Title: title, Data: errorData{Message: msg, Back: back}})
}

// stamp formats t for a page: UTC to the second, or a dash when zero.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// ago formats t relative to now: "3m ago", "in 20s".
func ago(now, t time.Time) string {
	if t.IsZero() {
		return ""
	}
	if d := now.Sub(t); d >= 0 {
		return short(d) + " ago"
	}
	return "in " + short(t.Sub(now))
}

// short formats d coarsely: 42s, 5m, 3h, 2d.
func short(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d/time.Hour))
	}
	return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
}
