module github.com/idem-dev/idem/idemmysql

go 1.25.0

require (
	github.com/go-sql-driver/mysql v1.10.1
	github.com/idem-dev/idem v0.1.0
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/go-json-experiment/json v0.0.0-20260213210345-44df1a37e875 // indirect
)

replace github.com/idem-dev/idem => ..
