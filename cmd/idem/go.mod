module github.com/idem-dev/idem/cmd/idem

go 1.25.0

require (
	github.com/chromedp/chromedp v0.23.0
	github.com/go-json-experiment/json v0.0.0-20260213210345-44df1a37e875
	github.com/idem-dev/idem v0.1.0
	github.com/idem-dev/idem/idemamqp v0.1.0
	github.com/idem-dev/idem/idemcache v0.1.0
	github.com/idem-dev/idem/idemgrpc v0.1.0
	github.com/idem-dev/idem/idemmaint v0.1.0
	github.com/idem-dev/idem/idemmysql v0.1.0
	github.com/idem-dev/idem/idemnats v0.1.0
	github.com/idem-dev/idem/idempgx v0.1.0
	github.com/idem-dev/idem/idemprom v0.1.0
	github.com/idem-dev/idem/idemredis v0.1.0
	github.com/idem-dev/idem/idemsqlite v0.1.0
	github.com/idem-dev/idem/internal/pgxmigrate v0.1.0
	github.com/idem-dev/idem/internal/testenv/redisproc v0.1.0
	github.com/idem-dev/idem/outbox v0.1.0
	github.com/idem-dev/idem/outbox/outboxamqp v0.1.0
	github.com/idem-dev/idem/outbox/outboxnats v0.1.0
	github.com/jackc/pgx/v5 v5.12.0
	github.com/prometheus/client_golang v1.24.1
	github.com/redis/go-redis/v9 v9.22.0
	go.uber.org/goleak v1.3.0
	google.golang.org/grpc v1.84.0
	google.golang.org/protobuf v1.36.12
	modernc.org/sqlite v1.59.0
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/klauspost/compress v1.20.1 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	golang.org/x/crypto v0.55.0 // indirect
)

require (
	github.com/anishathalye/porcupine v1.3.1
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/chromedp/cdproto v0.159.0 // indirect
	github.com/dustin/go-humanize v1.1.0 // indirect
	github.com/go-sql-driver/mysql v1.10.1
	github.com/google/uuid v1.6.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/mattn/go-isatty v0.0.24 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/nats-io/nats.go v1.53.1
	github.com/ncruces/go-strftime v1.1.0 // indirect
	github.com/prometheus/client_model v0.6.3 // indirect
	github.com/prometheus/common v0.71.0 // indirect
	github.com/prometheus/procfs v0.22.0 // indirect
	github.com/rabbitmq/amqp091-go v1.16.0
	github.com/remyoudompheng/bigfft v0.0.0-20230129092748-24d4a6f8daec // indirect
	github.com/stripe/stripe-go/v82 v82.5.1
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/net v0.58.0 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
	golang.org/x/text v0.41.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1 // indirect
	modernc.org/libc v1.76.0 // indirect
	modernc.org/mathutil v1.7.1 // indirect
	modernc.org/memory v1.12.1 // indirect
)

replace github.com/idem-dev/idem => ../..

replace github.com/idem-dev/idem/idemcache => ../../idemcache

replace github.com/idem-dev/idem/idemgrpc => ../../idemgrpc

replace github.com/idem-dev/idem/idemmaint => ../../idemmaint

replace github.com/idem-dev/idem/idempgx => ../../idempgx

replace github.com/idem-dev/idem/idemprom => ../../idemprom

replace github.com/idem-dev/idem/idemredis => ../../idemredis

replace github.com/idem-dev/idem/idemsqlite => ../../idemsqlite

replace github.com/idem-dev/idem/internal/pgxmigrate => ../../internal/pgxmigrate

replace github.com/idem-dev/idem/internal/testenv/redisproc => ../../internal/testenv/redisproc

replace github.com/idem-dev/idem/outbox => ../../outbox

replace github.com/idem-dev/idem/idemamqp => ../../idemamqp

replace github.com/idem-dev/idem/idemnats => ../../idemnats

replace github.com/idem-dev/idem/outbox/outboxamqp => ../../outbox/outboxamqp

replace github.com/idem-dev/idem/outbox/outboxnats => ../../outbox/outboxnats

replace github.com/idem-dev/idem/idemmysql => ../../idemmysql
