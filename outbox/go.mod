module github.com/idem-dev/idem/outbox

go 1.25.0

require (
	github.com/idem-dev/idem v0.1.0
	github.com/idem-dev/idem/idemsqlite v0.1.0
	github.com/idem-dev/idem/internal/pgxmigrate v0.1.0
	github.com/jackc/pgx/v5 v5.12.0
	go.uber.org/goleak v1.3.0
	modernc.org/sqlite v1.59.0
)

require filippo.io/edwards25519 v1.2.0 // indirect

require (
	github.com/dustin/go-humanize v1.1.0 // indirect
	github.com/go-json-experiment/json v0.0.0-20260213210345-44df1a37e875 // indirect
	github.com/go-sql-driver/mysql v1.10.1
	github.com/google/uuid v1.6.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/mattn/go-isatty v0.0.24 // indirect
	github.com/ncruces/go-strftime v1.1.0 // indirect
	github.com/remyoudompheng/bigfft v0.0.0-20230129092748-24d4a6f8daec // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
	golang.org/x/text v0.41.0 // indirect
	modernc.org/libc v1.76.0 // indirect
	modernc.org/mathutil v1.7.1 // indirect
	modernc.org/memory v1.12.1 // indirect
)

replace github.com/idem-dev/idem => ..

replace github.com/idem-dev/idem/idemsqlite => ../idemsqlite

replace github.com/idem-dev/idem/internal/pgxmigrate => ../internal/pgxmigrate
