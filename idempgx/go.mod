module github.com/idem-dev/idem/idempgx

go 1.25.0

require (
	github.com/idem-dev/idem v0.1.0
	github.com/idem-dev/idem/internal/pgxmigrate v0.1.0
	github.com/jackc/pgx/v5 v5.12.0
)

require (
	github.com/go-json-experiment/json v0.0.0-20260213210345-44df1a37e875 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)

replace github.com/idem-dev/idem => ..

replace github.com/idem-dev/idem/internal/pgxmigrate => ../internal/pgxmigrate
