module github.com/idem-dev/idem

go 1.25.0

require (
	github.com/go-json-experiment/json v0.0.0-20260213210345-44df1a37e875
	github.com/google/uuid v1.6.0
)
