package idemprom_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemprom"
)

// BenchmarkRequest is what the middleware reports for one new key: its
// decision, the reservation's and the completion's store calls and the
// stored response, from concurrent requests.
func BenchmarkRequest(b *testing.B) {
	m := idemprom.New(prometheus.NewRegistry(), &idemprom.Config{TenantLabel: true})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.Decision("POST /v1/payments", "tenant-a", idem.DecisionCreated)
			m.StoreCall("reserve", time.Millisecond, nil)
			m.ResponseStored("POST /v1/payments", 260)
			m.StoreCall("complete", time.Millisecond, nil)
		}
	})
}
