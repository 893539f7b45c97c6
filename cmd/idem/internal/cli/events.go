package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	paysvc "github.com/idem-dev/idem/cmd/idem/internal/payments"
	"github.com/idem-dev/idem/internal/redact"
	"github.com/idem-dev/idem/outbox"
	"github.com/idem-dev/idem/outbox/outboxamqp"
	"github.com/idem-dev/idem/outbox/outboxnats"
)

// Defaults of the --events URL's query parameters.
const (
	defaultEventsStream   = "PAYMENTS"
	defaultEventsExchange = "payments"
)

// eventsValue is --events: nats://… or amqp(s)://…, checked when set.
type eventsValue struct{ p *string }

func (v eventsValue) String() string {
	if v.p == nil {
		return ""
	}
	return redact.URL(*v.p)
}

func (v eventsValue) Set(s string) error {
	if _, err := parseEventsURL(s); err != nil {
		return err
	}
	*v.p = s
	return nil
}

// eventsTarget is a parsed --events URL.
type eventsTarget struct {
	kind string   // "nats" or "amqp"
	dial *url.URL // the broker's URL, without idem's query parameters
	// subject and stream (NATS), exchange (RabbitMQ).
	subject, stream, exchange string
}

// parseEventsURL reads nats://HOST:PORT[?subject=S&stream=NAME] or
// amqp[s]://USER:PASS@HOST:PORT/VHOST[?exchange=NAME]. Its errors never
// show the URL's password.
func parseEventsURL(raw string) (*eventsTarget, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return nil, errors.New("want nats://HOST:PORT or amqp://USER:PASS@HOST:PORT/")
	}
	q := u.Query()
	t := &eventsTarget{dial: u}
	take := func(name, def string) string {
		v := cmp.Or(q.Get(name), def)
		q.Del(name)
		return v
	}
	switch u.Scheme {
	case "nats", "tls":
		t.kind = "nats"
		t.subject = take("subject", paysvc.TopicPaymentSucceeded)
		t.stream = take("stream", defaultEventsStream)
	case "amqp", "amqps":
		t.kind = "amqp"
		t.exchange = take("exchange", defaultEventsExchange)
	default:
		return nil, fmt.Errorf("scheme %q: want nats://HOST:PORT (JetStream) or amqp://USER:PASS@HOST:PORT/ (RabbitMQ)", u.Scheme)
	}
	dial := *u
	dial.RawQuery = q.Encode()
	t.dial = &dial
	return t, nil
}

// openEvents connects to the --events broker and makes sure the events
// have somewhere to go: on NATS a stream that takes the subject (the
// stream named by ?stream=, PAYMENTS by default, is created when none
// does); on RabbitMQ the durable topic exchange ?exchange= (payments by
// default). It returns the publisher and what closes it.
func openEvents(ctx context.Context, raw string, logger *slog.Logger) (outbox.Publisher, func(), error) {
	t, err := parseEventsURL(raw)
	if err != nil {
		return nil, nil, err
	}
	where := redact.URL(raw)
	switch t.kind {
	case "nats":
		nc, err := nats.Connect(t.dial.String(), nats.Name("idem payments"), nats.MaxReconnects(-1))
		if err != nil {
			return nil, nil, fmt.Errorf("--events %s: %w", where, err)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			nc.Close()
			return nil, nil, fmt.Errorf("--events %s: %w", where, err)
		}
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if _, err := js.StreamNameBySubject(sctx, t.subject); err != nil {
			if !errors.Is(err, jetstream.ErrStreamNotFound) {
				nc.Close()
				return nil, nil, fmt.Errorf("--events %s: finding the stream of %s: %w", where, t.subject, err)
			}
			if _, err := js.CreateStream(sctx, jetstream.StreamConfig{Name: t.stream, Subjects: []string{t.subject}, Storage: jetstream.FileStorage}); err != nil {
				nc.Close()
				return nil, nil, fmt.Errorf("--events %s: creating stream %s on %s: %w", where, t.stream, t.subject, err)
			}
			logger.Info("events: created the stream", "stream", t.stream, "subject", t.subject)
		}
		subject := t.subject
		pub := outboxnats.New(js, &outboxnats.Config{Subject: func(outbox.Message) string { return subject }})
		return pub, nc.Close, nil
	default:
		r := &amqpEvents{url: t.dial.String(), where: where, exchange: t.exchange, log: logger}
		if err := r.connect(); err != nil {
			return nil, nil, err
		}
		return r, r.close, nil
	}
}

// amqpEvents publishes to RabbitMQ through outboxamqp, dialing again when
// the connection was lost: an AMQP connection does not come back by
// itself.
type amqpEvents struct {
	url, where, exchange string
	log                  *slog.Logger

	mu   sync.Mutex
	conn *amqp.Connection
	pub  *outboxamqp.Publisher
}

// connect dials the broker and declares the exchange.
func (r *amqpEvents) connect() error {
	conn, err := amqp.Dial(r.url)
	if err != nil {
		return fmt.Errorf("--events %s: %w", r.where, err)
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.ExchangeDeclare(r.exchange, amqp.ExchangeTopic, true, false, false, false, nil)
		ch.Close()
	}
	if err != nil {
		conn.Close()
		return fmt.Errorf("--events %s: declaring exchange %s: %w", r.where, r.exchange, err)
	}
	r.conn = conn
	r.pub = outboxamqp.New(conn, &outboxamqp.Config{Exchange: r.exchange})
	return nil
}

// Publish publishes m on the current connection, dialing again first when
// it was lost.
func (r *amqpEvents) Publish(ctx context.Context, m outbox.Message) (outbox.Outcome, error) {
	r.mu.Lock()
	if r.conn == nil || r.conn.IsClosed() {
		if r.pub != nil {
			r.pub.Close()
		}
		if err := r.connect(); err != nil {
			r.mu.Unlock()
			return outbox.OutcomeRetry, err
		}
		r.log.Info("events: connected to RabbitMQ again", "exchange", r.exchange)
	}
	pub := r.pub
	r.mu.Unlock()
	return pub.Publish(ctx, m)
}

func (r *amqpEvents) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pub != nil {
		r.pub.Close()
	}
	if r.conn != nil {
		r.conn.Close()
	}
}
