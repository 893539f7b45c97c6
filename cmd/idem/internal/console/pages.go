package console

import (
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idem-dev/idem/cmd/idem/internal/keyadmin"
	"github.com/idem-dev/idem/idemstore"
)

// storeTimeout bounds the store and outbox calls of one page.
const storeTimeout = 10 * time.Second

// previewBytes bounds the part of a stored body a page shows.
const previewBytes = 4096

// maxResolveBody bounds the response body an operator may store.
const maxResolveBody = 1 << 20

// states lists the record states in the order pages show them.
var states = []idemstore.State{idemstore.StateUnknown, idemstore.StateInProgress, idemstore.StateCompleted, idemstore.StateReleased}

// flashes are the messages a redirect after an action may ask a page to
// show; the query names one, so no request text is ever reflected.
var flashes = map[string]string{
	"completed": "Resolved: the record is completed and retries replay the response you entered.",
	"released":  "Resolved: the key is released and the next retry executes again.",
	"retried":   "The message is pending again and the relay will deliver it.",
	"handled":   "Marked handled: the discrepancy stays listed and is no longer counted.",
}

// --- overview ---

type stateCount struct {
	State string
	Count string
	Warn  bool
	Link  string
}

type decisionRow struct {
	Name  string
	Total string
	Rate  string
	Warn  bool
}

type outboxCounts struct {
	Pending, Done, Dead int
	Err                 string
}

type overviewData struct {
	States     []stateCount
	CountLimit int
	Decisions  []decisionRow
	RateNote   string
	Stats      []Stat
	Outbox     *outboxCounts
	Charts     *chartData
	TrendsLink string
	Masters    []string // the servers the counts cover, when there are several
}

// overview shows the records by state (bounded counts), the decision totals
// and rates, the maintainer's figures and the outbox counts.
func (c *console) overview(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), storeTimeout)
	defer cancel()
	d := overviewData{CountLimit: c.cfg.CountLimit}
	for _, s := range states {
		sc := stateCount{State: string(s), Link: c.cfg.Prefix + "/keys?state=" + string(s)}
		if s == idemstore.StateUnknown {
			sc.Link = c.cfg.Prefix + "/unknown"
		}
		n, truncated, err := c.countState(ctx, s)
		switch {
		case err != nil:
			c.cfg.Logger.Error("idem console: counting records failed", slog.String("state", string(s)), slog.Any("error", err))
			sc.Count, sc.Warn = "store unavailable", true
		case truncated:
			sc.Count = strconv.Itoa(n) + "+"
		default:
			sc.Count = strconv.Itoa(n)
		}
		if s == idemstore.StateUnknown && n > 0 {
			sc.Warn = true
		}
		d.States = append(d.States, sc)
	}
	if c.cfg.Masters != nil {
		masters, err := c.cfg.Masters(ctx)
		if err != nil {
			c.cfg.Logger.Error("idem console: naming the store's masters failed", slog.Any("error", err))
		}
		d.Masters = masters
	}
	var totals map[string]float64 // the table's and the chart's
	if c.cfg.Decisions != nil {
		totals = c.cfg.Decisions()
		d.Decisions, d.RateNote = c.decisionRows(totals, c.cfg.Now())
	}
	if c.cfg.Stats != nil {
		d.Stats = c.cfg.Stats(ctx)
	}
	if c.cfg.Outbox != nil {
		oc := &outboxCounts{}
		counts, err := c.cfg.Outbox.MessageCounts(ctx)
		if err != nil {
			c.cfg.Logger.Error("idem console: counting outbox messages failed", slog.Any("error", err))
			oc.Err = "The outbox could not be read."
		}
		oc.Pending, oc.Done, oc.Dead = counts["pending"], counts["done"], counts["dead"]
		d.Outbox = oc
	}
	if c.cfg.Trends != nil {
		charts := c.cfg.Trends.charts(c.cfg.Now(), totals, c.cfg.Decisions != nil, c.cfg.Outbox != nil)
		d.Charts, d.TrendsLink = &charts, c.cfg.Prefix+"/trends.json"
	}
	c.render(w, r, http.StatusOK, "overview", page{Title: "Overview", Nav: "overview", Data: d})
}

// countState counts the records in state s by paging through KeyList, at
// most CountLimit of them; truncated reports that there are more.
func (c *console) countState(ctx context.Context, s idemstore.State) (n int, truncated bool, err error) {
	var after *idemstore.Identity
	for {
		limit := min(1000, c.cfg.CountLimit+1-n)
		recs, err := c.cfg.Store.KeyList(ctx, &idemstore.ListParams{State: s, After: after, Limit: limit})
		if err != nil {
			return n, false, err
		}
		n += len(recs)
		if n > c.cfg.CountLimit {
			return c.cfg.CountLimit, true, nil
		}
		if len(recs) < limit {
			return n, false, nil
		}
		after = &recs[len(recs)-1].Identity
	}
}

// decisionRows turns decision totals into rows with their rates since an
// earlier overview.
func (c *console) decisionRows(totals map[string]float64, now time.Time) ([]decisionRow, string) {
	var rates map[string]float64
	var window time.Duration
	if c.cfg.Trends != nil {
		rates, window = c.cfg.Trends.rates(now, totals)
		for name, r := range rates {
			rates[name] = r / 60 // per second, as the tracker gives them
		}
	} else {
		rates, window = c.rates.observe(now, totals)
	}
	names := make([]string, 0, len(totals))
	for name := range totals {
		names = append(names, name)
	}
	slices.Sort(names)
	rows := make([]decisionRow, 0, len(names))
	for _, name := range names {
		row := decisionRow{Name: name, Total: strconv.FormatFloat(totals[name], 'f', -1, 64), Rate: "—"}
		if rate, ok := rates[name]; ok {
			row.Rate = strconv.FormatFloat(rate*60, 'f', 1, 64)
		}
		switch name {
		case "unknown", "store_error", "key_reused", "not_replayable", "untrusted":
			row.Warn = totals[name] > 0
		}
		rows = append(rows, row)
	}
	note := "Totals since the process started. Rates appear when two views are at least a second apart."
	if c.cfg.Trends != nil {
		note = "Totals since the process started. Rates appear a second after the console starts sampling."
	}
	if window > 0 {
		note = "Totals since the process started; rates over the last " + short(window) + "."
	}
	return rows, note
}

// --- key lists ---

type keyRow struct {
	Link                string
	Key, KeyHash        string
	Endpoint, Scope     string
	State               string
	Attempts            int
	Created, CreatedAgo string
	Updated, UpdatedAgo string
}

type keysData struct {
	Intro    string
	Filter   bool
	State    string
	Endpoint string
	Key      string // the start of the keys searched for
	States   []string
	Rows     []keyRow
	Empty    string
	Err      string
	Note     string
	Next     string
	Prev     string
}

// unknownQueue lists the unknown records, the ones waiting for
// reconciliation or an operator.
func (c *console) unknownQueue(w http.ResponseWriter, r *http.Request) {
	d := keysData{
		Intro: "These keys' outcomes are unknown: their attempt may or may not have had its effect. Clients get 409 outcome-unknown until the reconciler or an operator resolves them. Open one to resolve it. " +
			"This is the idempotency record's state, not a payment's: a payment in requires_reconciliation has its own row (its charge's outcome at the provider is unknown, and the payments service's reconciler asks the provider), while its key is completed and replays the answer the client got.",
		State: string(idemstore.StateUnknown),
		Empty: "No unknown records: nothing to resolve.",
	}
	c.listKeys(w, r, "Unknown queue", "unknown", "/unknown", d)
}

// keyList lists records newest first, optionally of one state and one
// endpoint, and whose key starts with a search text, a page at a time. The
// store lists records by identity, so the page sorts the matching records
// it scans (at most CountLimit) by creation time.
func (c *console) keyList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	state, endpoint, key := q.Get("state"), q.Get("endpoint"), q.Get("key")
	if state != "" && !idemstore.State(state).Valid() {
		c.renderError(w, r, http.StatusBadRequest, "Bad request", "There is no such state.")
		return
	}
	pageNo := 1
	if p := q.Get("page"); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 {
			c.renderError(w, r, http.StatusBadRequest, "Bad request", "The page number is not valid.")
			return
		}
		pageNo = n
	}
	d := keysData{Filter: true, State: state, Endpoint: endpoint, Key: key, Empty: "No records."}
	if state != "" || endpoint != "" || key != "" {
		d.Empty = "No records match the filter."
	}
	for _, s := range states {
		d.States = append(d.States, string(s))
	}
	ctx, cancel := context.WithTimeout(r.Context(), storeTimeout)
	defer cancel()
	recs, truncated, err := c.scanRecords(ctx, idemstore.State(state), endpoint, key)
	if err != nil {
		c.cfg.Logger.Error("idem console: listing records failed", slog.Any("error", err))
		d.Err = "The store is unavailable: " + errorClass(err)
	}
	slices.SortStableFunc(recs, func(a, b *idemstore.Record) int { return b.CreatedAt.Compare(a.CreatedAt) })
	if truncated {
		d.Note = fmt.Sprintf("Sorted among the first %d matching records the store listed; narrow the filter to see the others.", c.cfg.CountLimit)
	}
	link := func(n int) string {
		v := url.Values{}
		if state != "" {
			v.Set("state", state)
		}
		if endpoint != "" {
			v.Set("endpoint", endpoint)
		}
		if key != "" {
			v.Set("key", key)
		}
		v.Set("page", strconv.Itoa(n))
		return c.cfg.Prefix + "/keys?" + v.Encode()
	}
	from := (pageNo - 1) * c.cfg.PageSize
	if from < len(recs) {
		to := min(from+c.cfg.PageSize, len(recs))
		if to < len(recs) {
			d.Next = link(pageNo + 1)
		}
		recs = recs[from:to]
	} else {
		recs = nil
	}
	if pageNo > 1 {
		d.Prev = link(pageNo - 1)
	}
	d.Rows = c.keyRows(recs)
	c.render(w, r, http.StatusOK, "keys", page{Title: "Keys", Nav: "keys", Data: d})
}

// scanRecords lists the records in state (any when empty) on endpoint (any
// when empty) whose key starts with keyPrefix, at most CountLimit of them;
// truncated reports there are more. The store does not filter by key: a
// search reads the records a page at a time until CountLimit match, within
// the page's store timeout.
func (c *console) scanRecords(ctx context.Context, state idemstore.State, endpoint, keyPrefix string) (recs []*idemstore.Record, truncated bool, err error) {
	var after *idemstore.Identity
	for {
		limit := min(1000, c.cfg.CountLimit+1-len(recs))
		if keyPrefix != "" {
			limit = 1000
		}
		page, err := c.cfg.Store.KeyList(ctx, &idemstore.ListParams{State: state, Endpoint: endpoint, After: after, Limit: limit})
		if err != nil {
			return recs, false, err
		}
		for _, rec := range page {
			if strings.HasPrefix(rec.Key, keyPrefix) {
				recs = append(recs, rec)
			}
		}
		if len(recs) > c.cfg.CountLimit {
			return recs[:c.cfg.CountLimit], true, nil
		}
		if len(page) < limit {
			return recs, false, nil
		}
		after = &page[len(page)-1].Identity
	}
}

// keyRows turns records into the rows of a key list.
func (c *console) keyRows(recs []*idemstore.Record) []keyRow {
	now := c.cfg.Now()
	rows := make([]keyRow, 0, len(recs))
	for _, rec := range recs {
		rows = append(rows, keyRow{
			Link:       c.keyLink(rec.Identity, ""),
			Key:        rec.Key,
			KeyHash:    keyHash(rec.Identity),
			Endpoint:   rec.Endpoint,
			Scope:      rec.Scope,
			State:      string(rec.State),
			Attempts:   rec.Attempts,
			Created:    stamp(rec.CreatedAt),
			CreatedAgo: ago(now, rec.CreatedAt),
			Updated:    stamp(rec.UpdatedAt),
			UpdatedAgo: ago(now, rec.UpdatedAt),
		})
	}
	return rows
}

// listKeys renders one page of records in d.State after the "after" cursor.
func (c *console) listKeys(w http.ResponseWriter, r *http.Request, title, nav, path string, d keysData) {
	ctx, cancel := context.WithTimeout(r.Context(), storeTimeout)
	defer cancel()
	p := &idemstore.ListParams{State: idemstore.State(d.State), Limit: c.cfg.PageSize + 1}
	if a := r.URL.Query().Get("after"); a != "" {
		ref, err := c.keys.open(a)
		if err != nil {
			c.renderError(w, r, http.StatusBadRequest, "Bad request", "The page link is not valid (the console token may have changed).")
			return
		}
		id := ref.identity()
		p.After = &id
	}
	recs, err := c.cfg.Store.KeyList(ctx, p)
	if err != nil {
		c.cfg.Logger.Error("idem console: listing records failed", slog.Any("error", err))
		d.Err = "The store is unavailable: " + errorClass(err)
	}
	if len(recs) > c.cfg.PageSize {
		recs = recs[:c.cfg.PageSize]
		q := url.Values{"after": {c.keys.seal(ref{Scope: recs[len(recs)-1].Scope, Endpoint: recs[len(recs)-1].Endpoint, Key: recs[len(recs)-1].Key})}}
		if d.Filter && d.State != "" {
			q.Set("state", d.State)
		}
		d.Next = c.cfg.Prefix + path + "?" + q.Encode()
	}
	d.Rows = c.keyRows(recs)
	c.render(w, r, http.StatusOK, "keys", page{Title: title, Nav: nav, Data: d})
}

// keyLink returns the URL of a record's page, with an optional flash.
func (c *console) keyLink(id idemstore.Identity, done string) string {
	q := url.Values{"ref": {c.keys.seal(ref{Scope: id.Scope, Endpoint: id.Endpoint, Key: id.Key})}}
	if done != "" {
		q.Set("done", done)
	}
	return c.cfg.Prefix + "/key?" + q.Encode()
}

// --- one key ---

type event struct {
	At, Ago, What string
}

type header struct {
	Name, Value string
}

type respView struct {
	Status    int
	Headers   []header
	Size      int
	Shown     int
	Truncated bool
	Binary    bool
	Preview   string
}

type keyData struct {
	Rec        *idemstore.Record
	KeyHash    string
	History    []event
	Resp       *respView
	CanResolve bool
	ResolveRef string
	// NextReconcile is when the reconciler may next ask about an unknown
	// record ("due now" when it may at once); empty for other states.
	NextReconcile string
}

// keyPage shows a record: its fields, its history, its stored response and,
// for an unknown record, the resolve actions.
func (c *console) keyPage(w http.ResponseWriter, r *http.Request) {
	rf, err := c.keys.open(r.URL.Query().Get("ref"))
	if err != nil {
		c.renderError(w, r, http.StatusNotFound, "Not found", "The key link is not valid (the console token may have changed).")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), storeTimeout)
	defer cancel()
	rec, err := c.cfg.Store.KeyGet(ctx, rf.identity())
	switch {
	case errors.Is(err, idemstore.ErrNotFound):
		c.renderErrorBack(w, r, http.StatusNotFound, "Not found",
			"This record does not exist (any more): it was deleted after its retention, or its request was rejected.", c.cfg.Prefix+"/unknown")
		return
	case err != nil:
		c.cfg.Logger.Error("idem console: reading a record failed", slog.String("key_hash", keyHash(rf.identity())), slog.Any("error", err))
		c.renderError(w, r, http.StatusServiceUnavailable, "Store unavailable", "The record could not be read: "+errorClass(err))
		return
	}
	now := c.cfg.Now()
	d := keyData{
		Rec:        rec,
		KeyHash:    keyHash(rec.Identity),
		History:    history(rec, now),
		Resp:       responseView(rec.Response),
		CanResolve: rec.State == idemstore.StateUnknown,
	}
	if rec.State == idemstore.StateUnknown {
		d.NextReconcile = "due now"
		if rec.ReconcileAfter.After(now) {
			d.NextReconcile = stamp(rec.ReconcileAfter) + " (" + ago(now, rec.ReconcileAfter) + ")"
		}
	}
	if d.CanResolve {
		d.ResolveRef = c.keys.seal(ref{Scope: rec.Scope, Endpoint: rec.Endpoint, Key: rec.Key, Token: rec.Token})
	}
	c.render(w, r, http.StatusOK, "key", page{Title: "Key", Nav: "keys", Flash: flashes[r.URL.Query().Get("done")], Data: d})
}

// history lists what the record's timestamps tell, oldest first.
func history(rec *idemstore.Record, now time.Time) []event {
	var ev []event
	add := func(t time.Time, what string) {
		if !t.IsZero() {
			ev = append(ev, event{At: stamp(t), Ago: ago(now, t), What: what})
		}
	}
	add(rec.CreatedAt, "created: the first attempt reserved the key")
	if rec.Attempts > 1 {
		add(rec.StartedAt, fmt.Sprintf("attempt %d reserved the key (the earlier ones were released)", rec.Attempts))
	}
	if rec.RecoveryPoint != "" {
		ev = append(ev, event{At: "—", What: "last committed phase: " + rec.RecoveryPoint})
	}
	last := "last change: now " + string(rec.State)
	switch rec.State {
	case idemstore.StateInProgress:
		last = "last change: the attempt holds the lease"
	case idemstore.StateCompleted:
		last = "completed: the response is stored"
		if rec.NotReplayable {
			last = "completed, not replayable"
		}
	case idemstore.StateUnknown:
		last = "outcome unknown: waiting for reconciliation"
	case idemstore.StateReleased:
		last = "released: the next retry executes again"
	}
	add(rec.UpdatedAt, last)
	if rec.State == idemstore.StateInProgress {
		add(rec.LockedUntil, "the lease ends; it then turns "+string(rec.LeaseExpiredState))
	}
	if rec.State == idemstore.StateUnknown {
		add(rec.ExpiresAt, "retention would have ended: an unknown record is kept until it is settled, and its retention starts again then")
	} else {
		add(rec.ExpiresAt, "retention ends: the record is deleted and the key may be used as new")
	}
	slices.SortStableFunc(ev, func(a, b event) int {
		if a.At == "—" || b.At == "—" {
			return 0
		}
		return strings.Compare(a.At, b.At)
	})
	return ev
}

// responseView prepares a stored response for display: text bodies as text
// (html/template escapes them), others as hex, both cut to previewBytes.
func responseView(resp *idemstore.Response) *respView {
	if resp == nil {
		return nil
	}
	v := &respView{Status: resp.Status, Size: len(resp.Body)}
	names := make([]string, 0, len(resp.Header))
	for name := range resp.Header {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		for _, value := range resp.Header[name] {
			v.Headers = append(v.Headers, header{Name: name, Value: value})
		}
	}
	body := resp.Body
	if len(body) > previewBytes {
		body, v.Truncated = body[:previewBytes], true
		// Back off a character the cut split in half.
		for i := 0; i < utf8.UTFMax-1 && len(body) > 0 && !utf8.Valid(body); i++ {
			body = body[:len(body)-1]
		}
	}
	v.Shown = len(body)
	if utf8.Valid(body) && !strings.ContainsRune(string(body), 0) {
		v.Preview = string(body)
	} else {
		v.Binary = true
		v.Preview = hex.Dump(body[:min(len(body), 512)])
		v.Shown = min(len(body), 512)
	}
	return v
}

// resolve settles an unknown record to completed (with the response the
// operator entered) or released, fenced on the token the page showed.
func (c *console) resolve(w http.ResponseWriter, r *http.Request) {
	rf, err := c.keys.open(r.PostForm.Get("ref"))
	if err != nil || rf.Token == "" {
		c.renderError(w, r, http.StatusBadRequest, "Bad request", "The form is not valid (the console token may have changed). Reload the key's page.")
		return
	}
	id := rf.identity()
	back := c.keyLink(id, "")
	res := &keyadmin.Resolution{Identity: id, Token: rf.Token, To: idemstore.State(r.PostForm.Get("to")), Operator: sessionFrom(r).operator}
	switch res.To {
	case idemstore.StateReleased:
	case idemstore.StateCompleted:
		if r.PostForm.Get("not_replayable") != "" {
			break
		}
		status, err := strconv.Atoi(r.PostForm.Get("status"))
		if err != nil || status < 200 || status > 599 {
			c.renderErrorBack(w, r, http.StatusBadRequest, "Bad request", "The status must be a number from 200 to 599.", back)
			return
		}
		body := r.PostForm.Get("body")
		if len(body) > maxResolveBody {
			c.renderErrorBack(w, r, http.StatusBadRequest, "Bad request", fmt.Sprintf("The body must be at most %d bytes.", maxResolveBody), back)
			return
		}
		resp := &idemstore.Response{Status: status, Header: http.Header{}, Body: []byte(body)}
		if ct := strings.TrimSpace(r.PostForm.Get("content_type")); ct != "" && len(body) > 0 {
			if strings.ContainsAny(ct, "\r\n") {
				c.renderErrorBack(w, r, http.StatusBadRequest, "Bad request", "The Content-Type is not valid.", back)
				return
			}
			resp.Header.Set("Content-Type", ct)
		}
		res.Response = resp
	default:
		c.renderErrorBack(w, r, http.StatusBadRequest, "Bad request", "A record resolves to completed or released.", back)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), storeTimeout)
	defer cancel()
	err = keyadmin.Resolve(ctx, c.cfg.Store, res)
	attrs := res.Audit()
	switch {
	case err == nil:
		c.cfg.Logger.LogAttrs(ctx, slog.LevelInfo, "idem console: operator resolved an unknown key", attrs...)
		http.Redirect(w, r, c.keyLink(id, string(res.To)), http.StatusSeeOther)
	case keyadmin.Changed(err):
		c.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "idem console: resolution refused, the record changed", append(attrs, slog.Any("error", err))...)
		c.renderErrorBack(w, r, http.StatusConflict, "The record changed",
			"Nothing was written: the record is no longer the unknown outcome this page showed (the reconciler or another operator resolved it, or a new attempt took it over). Check its current state.", back)
	case errors.Is(err, idemstore.ErrNotFound):
		c.renderErrorBack(w, r, http.StatusNotFound, "Not found", "The record does not exist any more.", c.cfg.Prefix+"/unknown")
	default:
		c.cfg.Logger.LogAttrs(ctx, slog.LevelError, "idem console: resolution failed", append(attrs, slog.Any("error", err))...)
		c.renderErrorBack(w, r, http.StatusServiceUnavailable, "Store unavailable", "Nothing was written: "+errorClass(err), back)
	}
}

// errorClass describes a store error without its text (which may carry
// connection details).
func errorClass(err error) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return "the store timed out."
	}
	return "the store returned an error (see the log)."
}

// --- outbox ---

type outboxRow struct {
	ID                      int64
	Topic, IdempotencyKey   string
	Attempts                int
	Available, AvailableAgo string
	LastError, Payload      string
	Why                     string // why the row is (not) moving
}

// outboxWhy explains where a message stands: when the relay takes it next,
// and after what.
func outboxWhy(m *OutboxMessage, now time.Time) string {
	switch m.State {
	case "dead":
		return fmt.Sprintf("The relay gave up after %d attempts; it will not move until Retry makes it pending again.", m.Attempts)
	case "done":
		return "Delivered."
	}
	failed := ""
	if m.LastError != "" {
		failed = " after the last attempt failed"
	}
	switch {
	case m.AvailableAt.After(now):
		if m.Attempts == 0 {
			return "Waiting: the relay takes it in " + short(m.AvailableAt.Sub(now)) + "."
		}
		return fmt.Sprintf("Backing off%s: attempt %d is due in %s.", failed, m.Attempts+1, short(m.AvailableAt.Sub(now)))
	case now.Sub(m.AvailableAt) < time.Minute:
		return fmt.Sprintf("Due now: attempt %d runs at the relay's next pass.", m.Attempts+1)
	}
	return fmt.Sprintf("Due for %s and not taken: the relay is stopped, stalled or busy; check its process and logs.", short(now.Sub(m.AvailableAt)))
}

type outboxData struct {
	Enabled bool
	State   string
	States  []string
	Rows    []outboxRow
	Err     string
	Next    string
}

// outboxPage lists the outbox messages in one state, dead letters with a
// retry action.
func (c *console) outboxPage(w http.ResponseWriter, r *http.Request) {
	d := outboxData{Enabled: c.cfg.Outbox != nil, State: cmp.Or(r.URL.Query().Get("state"), "pending"), States: []string{"pending", "dead", "done"}}
	if !slices.Contains(d.States, d.State) {
		c.renderError(w, r, http.StatusBadRequest, "Bad request", "There is no such outbox state.")
		return
	}
	if d.Enabled {
		var after int64
		if a := r.URL.Query().Get("after"); a != "" {
			var err error
			if after, err = strconv.ParseInt(a, 10, 64); err != nil {
				c.renderError(w, r, http.StatusBadRequest, "Bad request", "The page link is not valid.")
				return
			}
		}
		ctx, cancel := context.WithTimeout(r.Context(), storeTimeout)
		defer cancel()
		msgs, err := c.cfg.Outbox.MessageList(ctx, &OutboxListParams{State: d.State, AfterID: after, Limit: c.cfg.PageSize + 1})
		if err != nil {
			c.cfg.Logger.Error("idem console: listing outbox messages failed", slog.Any("error", err))
			d.Err = "The outbox could not be read (see the log)."
		}
		if len(msgs) > c.cfg.PageSize {
			msgs = msgs[:c.cfg.PageSize]
			d.Next = c.cfg.Prefix + "/outbox?" + url.Values{"state": {d.State}, "after": {strconv.FormatInt(msgs[len(msgs)-1].ID, 10)}}.Encode()
		}
		now := c.cfg.Now()
		for _, m := range msgs {
			d.Rows = append(d.Rows, outboxRow{
				ID: m.ID, Topic: m.Topic, IdempotencyKey: m.IdempotencyKey, Attempts: m.Attempts,
				Available: stamp(m.AvailableAt), AvailableAgo: ago(now, m.AvailableAt),
				LastError: cut(m.LastError, 300), Payload: cut(string(m.Payload), 300),
				Why: outboxWhy(m, now),
			})
		}
	}
	c.render(w, r, http.StatusOK, "outbox", page{Title: "Outbox", Nav: "outbox", Flash: flashes[r.URL.Query().Get("done")], Data: d})
}

// outboxRetry makes a dead message pending again.
func (c *console) outboxRetry(w http.ResponseWriter, r *http.Request) {
	back := c.cfg.Prefix + "/outbox?state=dead"
	if c.cfg.Outbox == nil {
		c.renderError(w, r, http.StatusNotFound, "Not found", "No outbox is connected to this console.")
		return
	}
	id, err := strconv.ParseInt(r.PostForm.Get("id"), 10, 64)
	if err != nil || id <= 0 {
		c.renderErrorBack(w, r, http.StatusBadRequest, "Bad request", "The message id is not valid.", back)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), storeTimeout)
	defer cancel()
	err = c.cfg.Outbox.MessageRedrive(ctx, id)
	attrs := []slog.Attr{
		slog.String("action", "outbox_retry"),
		slog.String("operator", sessionFrom(r).operator),
		slog.Int64("message_id", id),
		slog.String("from", "dead"),
		slog.String("to", "pending"),
	}
	switch {
	case err == nil:
		c.cfg.Logger.LogAttrs(ctx, slog.LevelInfo, "idem console: operator retried a dead outbox message", attrs...)
		http.Redirect(w, r, back+"&done=retried", http.StatusSeeOther)
	case errors.Is(err, ErrNoDeadMessage):
		c.renderErrorBack(w, r, http.StatusConflict, "Not a dead letter", "Nothing was changed: no dead message has this id (it may have been retried already).", back)
	default:
		c.cfg.Logger.LogAttrs(ctx, slog.LevelError, "idem console: retrying an outbox message failed", append(attrs, slog.Any("error", err))...)
		c.renderErrorBack(w, r, http.StatusServiceUnavailable, "Outbox unavailable", "Nothing was changed: the outbox returned an error (see the log).", back)
	}
}

// cut shortens s to at most n bytes on a character boundary, marking the cut.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
