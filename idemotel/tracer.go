// Package idemotel adapts OpenTelemetry tracing to idem.Tracer.
//
// The middleware starts "idem.request" around a protected request, with
// "idem.reserve", "idem.handler" and "idem.complete" inside it, and records
// the endpoint, a hash of the key (idem.key_hash, never the key) and the
// decision (idem.decision) as attributes:
//
//	tp := sdktrace.NewTracerProvider(…)
//	mw := idem.New(store, &idem.Config{Tracer: idemotel.NewTracer(tp)})
//
// The spans are children of the span in the request's context, so an
// otelhttp handler around the middleware makes them part of the server span.
// The core package idem does not depend on this package or on OpenTelemetry.
package idemotel

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-dev/idem"
)

// ScopeName is the instrumentation scope of the tracer NewTracer obtains.
const ScopeName = "github.com/idem-dev/idem"

// NewTracer returns an idem.Tracer that starts OpenTelemetry spans from tp,
// or from the global TracerProvider (otel.GetTracerProvider) when tp is nil.
func NewTracer(tp trace.TracerProvider) idem.Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return &tracer{t: tp.Tracer(ScopeName)}
}

type tracer struct {
	t trace.Tracer
}

// Start starts an internal span named name as a child of the span in ctx.
func (t *tracer) Start(ctx context.Context, name string) (context.Context, idem.Span) {
	ctx, s := t.t.Start(ctx, name, trace.WithSpanKind(trace.SpanKindInternal))
	return ctx, span{s}
}

type span struct {
	s trace.Span
}

// SetAttribute records a string attribute.
func (s span) SetAttribute(key, value string) {
	s.s.SetAttributes(attribute.String(key, value))
}

// End ends the span; a non-nil err is recorded and marks the span failed.
// The middleware's errors name keys by hash only, never by value.
func (s span) End(err error) {
	if err != nil {
		s.s.RecordError(err)
		s.s.SetStatus(codes.Error, err.Error())
	}
	s.s.End()
}
