module github.com/idem-dev/idem/idemredis

go 1.25.0

require (
	github.com/idem-dev/idem v0.1.0
	github.com/idem-dev/idem/internal/testenv/redisproc v0.1.0
	github.com/redis/go-redis/v9 v9.22.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/go-json-experiment/json v0.0.0-20260213210345-44df1a37e875 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
)

replace github.com/idem-dev/idem => ..

replace github.com/idem-dev/idem/internal/testenv/redisproc => ../internal/testenv/redisproc
