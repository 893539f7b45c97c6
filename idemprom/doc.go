// Package idemprom adapts idem.Metrics to Prometheus (client_golang).
//
// New registers the middleware's series:
//
//	idem_decisions_total{endpoint,tenant,decision}   counter
//	idem_store_call_seconds{op,result}               histogram
//	idem_response_stored_bytes{endpoint}             histogram
//
// The tenant label is empty unless Config.TenantLabel is set, and both the
// endpoint and the tenant label are bounded: after Config.MaxLabelValues
// distinct values of one label, further values are folded into "other", so
// a client that sprays tenants or a router that reports raw paths cannot
// blow up the series count.
//
// NewMaintainerCollector (or RegisterMaintainer) exports the maintainer's
// gauges and totals (unknown backlog, oldest in-progress lease, outbox depth,
// dead letters, …) from a callback read on every scrape:
//
//	reg := prometheus.NewRegistry()
//	metrics := idemprom.New(reg, &idemprom.Config{TenantLabel: true})
//	mw := idem.New(store, &idem.Config{Metrics: metrics})
//	idemprom.RegisterMaintainer(reg, func() idemprom.MaintainerStats { … })
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// The core package idem does not depend on this package or on client_golang.
package idemprom
