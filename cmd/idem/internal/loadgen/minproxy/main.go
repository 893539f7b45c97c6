// Command minproxy is the minimal idempotency layer of the end-to-end
// benchmark (scripts/bench/proxy.sh, BASELINES="minimal"): the bare reverse
// proxy plus the least a durable layer must do per request with the same
// store clients as idem and the peer (go-redis, pgx), and nothing else. A
// new key is two store round trips in sequence: before forwarding, the key
// is inserted (Redis SET NX; a PostgreSQL INSERT into a table with only a
// primary key, its own commit); after, the answer's status, Content-Type
// and body are stored under it (SET; UPDATE, its own commit), before the
// answer is sent. A key found with an answer is a replay, answered from
// the store without forwarding (Redis: the same SET NX returns it, one
// round trip; PostgreSQL: the insert, then a SELECT); a key found without
// one is answered 409 (and so is every retry of a key whose forward failed:
// the benchmark's never do). No fingerprint, lease, fencing token, index,
// retention, retry, grouping, batching, metrics or problem documents: what
// a hand-written layer sends, as a floor for a new key's cost.
//
//	go run ./cmd/idem/internal/loadgen/minproxy --listen 127.0.0.1:9002 \
//	    --upstream http://127.0.0.1:9000 --store 'redis://127.0.0.1:6379/0?prefix=min:'
//
// --store takes redis://…?prefix=P (keys P + the Idempotency-Key) or
// postgres://…?table=SCHEMA.TABLE (created if missing; 16 connections).
package main

import (
	"bytes"
	"context"
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
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

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

func open(ctx context.Context, raw string) (store, error) {
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
	return nil, fmt.Errorf("--store %q: want redis:// or postgres://", raw)
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
	storeURL := flag.String("store", "", "`URL` of the store: redis://…?prefix=P or postgres://…?table=S.T")
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
