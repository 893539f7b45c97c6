package idemprom_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// histogram returns the histogram of the series name{labels} gathered from
// reg, failing the test when it is absent.
func histogram(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) *dto.Histogram {
	t.Helper()
	m := series(t, reg, name, labels)
	if m == nil || m.GetHistogram() == nil {
		t.Fatalf("no histogram %s%v", name, labels)
	}
	return m.GetHistogram()
}

// series returns the series name{labels} gathered from reg, or nil.
func series(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; !ok || v != l.GetValue() {
					continue next
				}
			}
			return m
		}
	}
	return nil
}
