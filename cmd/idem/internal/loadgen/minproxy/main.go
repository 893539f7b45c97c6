// Command minproxy is the minimal idempotency layer of the end-to-end
// benchmark (scripts/bench/proxy.sh, BASELINES="minimal"): the bare reverse
// proxy plus the least a durable layer must do per request with the same
// store clients as idem and the peer (go-redis, pgx, modernc.org/sqlite),
// and nothing else. A new key is two store writes in sequence: before
// forwarding, the key is inserted (Redis SET NX; a SQL INSERT into a table
// with only a primary key, durable before the layer goes on); after, the
// answer's status, Content-Type and body are stored under it (SET; UPDATE,
// durable too), before the answer is sent. A key found with an answer is a
// replay, answered from the store without forwarding (Redis: the same SET
// NX returns it, one round trip; SQL: the insert, then a SELECT); a key
// found without one is answered 409 (and so is every retry of a key whose
// forward failed: the benchmark's never do). No fingerprint, lease, fencing
// token, index, retention, retry, metrics or problem documents: what a
// hand-written layer sends, as a floor for a new key's cost.
//
// PostgreSQL commits each write on its own (16 connections); SQLite, which
// has one writer, shares commits the simplest way (see sqliteStore), so that
// at 16 concurrent requests it is a floor for idemsqlite's group commit,
// not a layer that queues for one fsync per write.
//
//	go run ./cmd/idem/internal/loadgen/minproxy --listen 127.0.0.1:9002 \
//	    --upstream http://127.0.0.1:9000 --store 'redis://127.0.0.1:6379/0?prefix=min:'
//
// --store takes redis://…?prefix=P (keys P + the Idempotency-Key),
// postgres://…?table=SCHEMA.TABLE (created if missing; 16 connections) or
// sqlite:PATH?synchronous=FULL|NORMAL (the file created if missing, opened
// as idemsqlite opens it: WAL, the synchronous setting, FULL by default, a
// 5 s busy timeout).
package main

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/idem-dev/idem/cmd/idem/internal/loadgen"
)

// inProgress is what a key holds until its answer is stored.
const inProgress = "-"

// retention is how long a key is kept.
const retention = 24 * time.Hour

// store is a new key's two writes.
type store interface {
	// insert takes key; when the key is already there it returns what the
	// key holds (inProgress, or an answer) and false.
	insert(ctx context.Context, key string) (taken bool, held []byte, err error)
	// finish stores answer under key.
	finish(ctx context.Context, key string, answer []byte) error
}

type redisStore struct {
	c      *redis.Client
	prefix string
}

func (s *redisStore) insert(ctx context.Context, key string) (bool, []byte, error) {
	held, err := s.c.SetArgs(ctx, s.prefix+key, inProgress, redis.SetArgs{Mode: "NX", TTL: retention, Get: true}).Bytes()
	if errors.Is(err, redis.Nil) {
		return false, nil, nil
	}
	return err == nil, held, err
}

func (s *redisStore) finish(ctx context.Context, key string, answer []byte) error {
	return s.c.Set(ctx, s.prefix+key, answer, retention).Err()
}

type pgStore struct {
	pool          *pgxpool.Pool
	ins, upd, sel string
}

func (s *pgStore) insert(ctx context.Context, key string) (bool, []byte, error) {
	tag, err := s.pool.Exec(ctx, s.ins, key)
	if err != nil || tag.RowsAffected() == 1 {
		return false, nil, err
	}
	var held []byte
	err = s.pool.QueryRow(ctx, s.sel, key).Scan(&held)
	return true, held, err
}

func (s *pgStore) finish(ctx context.Context, key string, answer []byte) error {
	_, err := s.pool.Exec(ctx, s.upd, key, answer)
	return err
}

// sqliteStore is SQLite with the least group commit that lets writes
// arriving together share a commit, and so an fsync: one write connection,
// owned by a writer goroutine that takes the write that wakes it, begins a
// transaction (BEGIN IMMEDIATE), takes every write queued by then, runs
// them, commits once and only then answers each (a failed statement or
// commit fails the whole batch). No leader hand-off, yield, savepoints or
// batch bound: idemsqlite's batcher does those. The statements are
// prepared once, as idemsqlite's are.
//
// A replay is read by the writer too: the insert that finds the key, then a
// SELECT on the same connection, in a transaction that writes nothing for
// it (a batch of replays alone commits without a WAL write or an fsync).
// That is the cheaper of the two: a read pool costs a new key a read
// before its insert when it reads first, and a replay a second connection
// and read transaction after the insert when it writes first; what the
// writer costs instead is that replays take turns on one goroutine.
type sqliteStore struct {
	db            *sql.DB
	conn          *sql.Conn // the write connection, the writer's
	ins, upd, sel *sql.Stmt // prepared on conn
	queue         chan *sqliteWrite
	stopped       chan struct{} // closed when the writer returns
	// commits and writes count the committed transactions and the writes
	// they held (tests).
	commits, writes atomic.Int64
}

// sqliteWrite is one write queued for the writer.
type sqliteWrite struct {
	key    string
	answer []byte // nil for the insert
	taken  bool   // the insert found the key
	held   []byte // what the key held then
	err    error
	done   chan struct{} // closed when the write's transaction ended
}

func (s *sqliteStore) insert(ctx context.Context, key string) (bool, []byte, error) {
	w := &sqliteWrite{key: key}
	if err := s.do(ctx, w); err != nil {
		return false, nil, err
	}
	return w.taken, w.held, nil
}

func (s *sqliteStore) finish(ctx context.Context, key string, answer []byte) error {
	return s.do(ctx, &sqliteWrite{key: key, answer: answer})
}

// do queues w and waits until its transaction committed or failed.
func (s *sqliteStore) do(ctx context.Context, w *sqliteWrite) error {
	w.done = make(chan struct{})
	s.queue <- w
	select {
	case <-w.done:
		return w.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// write is the writer: one transaction per batch until the queue closes.
func (s *sqliteStore) write() {
	defer close(s.stopped)
	ctx := context.Background()
	for w := range s.queue {
		batch := []*sqliteWrite{w}
		_, err := s.conn.ExecContext(ctx, "BEGIN IMMEDIATE")
	take: // the writes queued while the transaction began join it
		for {
			select {
			case w, ok := <-s.queue:
				if !ok {
					break take
				}
				batch = append(batch, w)
			default:
				break take
			}
		}
		if err == nil {
			err = s.run(ctx, batch)
		}
		for _, w := range batch {
			if err != nil {
				w.err = err
			}
			close(w.done)
		}
	}
}

// run runs batch in the transaction begun and commits it, or rolls it back
// when a statement failed.
func (s *sqliteStore) run(ctx context.Context, batch []*sqliteWrite) error {
	err := func() error {
		for _, w := range batch {
			if err := s.apply(ctx, w); err != nil {
				return err
			}
		}
		_, err := s.conn.ExecContext(ctx, "COMMIT")
		return err
	}()
	if err != nil {
		_, rerr := s.conn.ExecContext(ctx, "ROLLBACK")
		return errors.Join(err, rerr)
	}
	s.commits.Add(1)
	s.writes.Add(int64(len(batch)))
	return nil
}

// apply runs one write's statements.
func (s *sqliteStore) apply(ctx context.Context, w *sqliteWrite) error {
	if w.answer != nil {
		_, err := s.upd.ExecContext(ctx, w.answer, w.key)
		return err
	}
	res, err := s.ins.ExecContext(ctx, w.key)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 1 {
		return err
	}
	w.taken = true
	return s.sel.QueryRowContext(ctx, w.key).Scan(&w.held)
}

// close stops the writer and closes the database.
func (s *sqliteStore) close() error {
	close(s.queue)
	<-s.stopped
	return errors.Join(s.conn.Close(), s.db.Close())
}

// openSQLite opens sqlite:PATH?synchronous=FULL|NORMAL as idemsqlite.Open
// opens a file: WAL, the synchronous setting (FULL: every commit durable
// against power loss), a 5 s busy timeout.
func openSQLite(ctx context.Context, raw string) (*sqliteStore, error) {
	path, rawQuery, _ := strings.Cut(strings.TrimPrefix(raw, "sqlite:"), "?")
	q, err := url.ParseQuery(rawQuery)
	if err != nil || path == "" {
		return nil, fmt.Errorf("--store %q: want sqlite:PATH?synchronous=FULL|NORMAL", raw)
	}
	synchronous := strings.ToUpper(cmp.Or(q.Get("synchronous"), "FULL"))
	if synchronous != "FULL" && synchronous != "NORMAL" {
		return nil, fmt.Errorf("--store %q: synchronous: want FULL or NORMAL", raw)
	}
	db, err := sql.Open("sqlite", path+"?_busy_timeout=5000&_journal_mode=WAL&_synchronous="+synchronous)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	s := &sqliteStore{db: db, queue: make(chan *sqliteWrite, 1024), stopped: make(chan struct{})}
	err = func() error {
		if s.conn, err = db.Conn(ctx); err != nil {
			return err
		}
		if _, err := s.conn.ExecContext(ctx, fmt.Sprintf("CREATE TABLE IF NOT EXISTS keys"+
			" (key TEXT PRIMARY KEY, answer BLOB NOT NULL, expires_at INTEGER NOT NULL DEFAULT (unixepoch() + %d))",
			int64(retention.Seconds()))); err != nil {
			return err
		}
		for p, text := range map[**sql.Stmt]string{
			&s.ins: "INSERT INTO keys (key, answer) VALUES (?, '" + inProgress + "') ON CONFLICT (key) DO NOTHING",
			&s.upd: "UPDATE keys SET answer = ? WHERE key = ?",
			&s.sel: "SELECT answer FROM keys WHERE key = ?",
		} {
			if *p, err = s.conn.PrepareContext(ctx, text); err != nil {
				return err
			}
		}
		return nil
	}()
	if err != nil {
		db.Close()
		return nil, err
	}
	go s.write()
	return s, nil
}

func open(ctx context.Context, raw string) (store, error) {
	if strings.HasPrefix(raw, "sqlite:") {
		return openSQLite(ctx, raw)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	q := u.Query()
	switch u.Scheme {
	case "redis":
		prefix := q.Get("prefix")
		q.Del("prefix")
		u.RawQuery = q.Encode()
		opt, err := redis.ParseURL(u.String())
		if err != nil {
			return nil, err
		}
		return &redisStore{c: redis.NewClient(opt), prefix: prefix}, nil
	case "postgres", "postgresql":
		table := q.Get("table")
		if table == "" {
			return nil, fmt.Errorf("--store %q: want ?table=SCHEMA.TABLE", raw)
		}
		q.Del("table")
		u.RawQuery = q.Encode()
		cfg, err := pgxpool.ParseConfig(u.String())
		if err != nil {
			return nil, err
		}
		cfg.MaxConns = 16
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, err
		}
		name := pgx.Identifier(strings.Split(table, ".")).Sanitize()
		if _, err := pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+name+
			" (key text PRIMARY KEY, answer bytea NOT NULL, expires_at timestamptz NOT NULL DEFAULT now() + interval '24 hours')"); err != nil {
			return nil, err
		}
		return &pgStore{pool: pool,
			ins: "INSERT INTO " + name + " (key, answer) VALUES ($1, '" + inProgress + "') ON CONFLICT (key) DO NOTHING",
			upd: "UPDATE " + name + " SET answer = $2 WHERE key = $1",
			sel: "SELECT answer FROM " + name + " WHERE key = $1",
		}, nil
	}
	return nil, fmt.Errorf("--store %q: want redis://, postgres:// or sqlite:PATH", raw)
}

// encode is a stored answer: "STATUS CONTENT-TYPE\n" and the body.
func encode(status int, contentType string, body []byte) []byte {
	b := strconv.AppendInt(make([]byte, 0, 32+len(contentType)+len(body)), int64(status), 10)
	b = append(append(append(b, ' '), contentType...), '\n')
	return append(b, body...)
}

// replay writes the stored answer held.
func replay(w http.ResponseWriter, held []byte) {
	head, body, _ := bytes.Cut(held, []byte{'\n'})
	status, contentType, _ := strings.Cut(string(head), " ")
	code, err := strconv.Atoi(status)
	if err != nil {
		http.Error(w, "stored answer unreadable", http.StatusInternalServerError)
		return
	}
	if contentType != "" {
		w.Header().Set("Content-Type", contentType)
	}
	w.Header().Set("Idempotent-Replayed", "true")
	w.WriteHeader(code)
	w.Write(body)
}

func main() {
	listen := flag.String("listen", "127.0.0.1:9002", "`ADDR` to serve on")
	upstream := flag.String("upstream", "http://127.0.0.1:9000", "`URL` to forward to")
	storeURL := flag.String("store", "", "`URL` of the store: redis://…?prefix=P, postgres://…?table=S.T or sqlite:PATH")
	flag.Parse()
	target, err := url.Parse(*upstream)
	if err != nil || target.Host == "" {
		log.Fatalf("--upstream %q: want an http URL", *upstream)
	}
	st, err := open(context.Background(), *storeURL)
	if err != nil {
		log.Fatal(err)
	}
	ln := loadgen.Listen(*listen)
	log.Printf("minimal idempotency proxy listening on %s, forwarding to %s", ln.Addr(), target)
	loadgen.Serve(ln, handler(st, target))
}

// handler is the minimal layer over st in front of target.
func handler(st store, target *url.URL) http.Handler {
	// bareproxy's tuned transport, as idem proxy's.
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 256
	t.MaxIdleConns = 1024
	rp := &httputil.ReverseProxy{
		Rewrite:   func(r *httputil.ProxyRequest) { r.SetURL(target) },
		Transport: t,
		// The answer is stored before it is sent: a retry after the
		// reply finds it.
		ModifyResponse: func(res *http.Response) error {
			body, err := io.ReadAll(res.Body)
			res.Body.Close()
			if err != nil {
				return err
			}
			answer := encode(res.StatusCode, res.Header.Get("Content-Type"), body)
			if err := st.finish(res.Request.Context(), res.Request.Header.Get("Idempotency-Key"), answer); err != nil {
				return err
			}
			res.Body = io.NopCloser(bytes.NewReader(body))
			return nil
		},
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		if key == "" {
			rp.ServeHTTP(w, r)
			return
		}
		taken, held, err := st.insert(r.Context(), key)
		switch {
		case err != nil:
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		case !taken:
			rp.ServeHTTP(w, r)
		case string(held) == inProgress:
			http.Error(w, "a request with this key is in progress", http.StatusConflict)
		default:
			replay(w, held)
		}
	})
}
