package main

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/ratewarden/ratewarden/internal/tracing"
	"github.com/ratewarden/ratewarden/metering/chsink"
	"github.com/ratewarden/ratewarden/metering/consumer"
)

// tracedSink writes each batch inside a span, "meter.write_batch" (a root
// span: a batch gathers the events of many traces), whose children are
// the batch's INSERTs (tracing.ClickHouse on the connection). It counts
// the batch's traced events; each of those is found from its trace with
// decisions_raw.trace_id (docs/tracing.md).
type tracedSink struct {
	consumer.Sink
	tracer trace.Tracer
}

func (s tracedSink) Write(ctx context.Context, partition int, recs []chsink.Record, last int64, p *chsink.Progress) error {
	ctx, span := s.tracer.Start(ctx, "meter.write_batch")
	if !span.IsRecording() {
		err := s.Sink.Write(ctx, partition, recs, last, p)
		span.End()
		return err
	}
	traced := 0
	for i := range recs {
		if recs[i].Event.TraceID != "" {
			traced++
		}
	}
	span.SetAttributes(
		attribute.Int("messaging.destination.partition.id", partition),
		attribute.Int("ratewarden.batch.events", len(recs)),
		attribute.Int64("ratewarden.batch.last_offset", last),
		attribute.Int("ratewarden.batch.traced_events", traced),
	)
	err := s.Sink.Write(ctx, partition, recs, last, p)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "batch not written")
	}
	span.End()
	return err
}

// tracedConsumerSink is sink with its batch spans when tracing is on.
func tracedConsumerSink(tr *tracing.Provider, sink consumer.Sink) consumer.Sink {
	if !tr.Enabled() {
		return sink
	}
	return tracedSink{Sink: sink, tracer: tr.Tracer()}
}
