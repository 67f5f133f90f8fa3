package tracing

import (
	"context"
	"strings"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// ClickHouse returns conn with a client span per query made inside a
// sampled span (a traced HTTP request): Select, Query (until its rows are
// closed), QueryRow, Exec, and PrepareBatch (until Send or Abort). The
// span carries the statement with its placeholders; bound values are
// never recorded. Queries outside a traced request (schema migrations,
// readiness pings) make no span. With tracing off conn is returned as is.
func (p *Provider) ClickHouse(conn driver.Conn) driver.Conn {
	if !p.Enabled() {
		return conn
	}
	return tracedConn{Conn: conn, tracer: p.tracer}
}

type tracedConn struct {
	driver.Conn
	tracer trace.Tracer
}

func (c tracedConn) start(ctx context.Context, query string) (context.Context, trace.Span, bool) {
	if !trace.SpanFromContext(ctx).IsRecording() {
		return ctx, nil, false
	}
	op, _, _ := strings.Cut(strings.TrimSpace(query), " ")
	ctx, span := c.tracer.Start(ctx, "clickhouse "+strings.ToUpper(op), trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(semconv.DBSystemNameClickHouse, semconv.DBOperationName(strings.ToUpper(op)), semconv.DBQueryText(query)))
	return ctx, span, true
}

func end(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "query failed")
	}
	span.End()
}

func (c tracedConn) Select(ctx context.Context, dest any, query string, args ...any) error {
	ctx, span, ok := c.start(ctx, query)
	err := c.Conn.Select(ctx, dest, query, args...)
	if ok {
		end(span, err)
	}
	return err
}

func (c tracedConn) Query(ctx context.Context, query string, args ...any) (driver.Rows, error) {
	ctx, span, ok := c.start(ctx, query)
	rows, err := c.Conn.Query(ctx, query, args...)
	if !ok {
		return rows, err
	}
	if err != nil {
		end(span, err)
		return rows, err
	}
	return &tracedRows{Rows: rows, span: span}, nil
}

func (c tracedConn) QueryRow(ctx context.Context, query string, args ...any) driver.Row {
	ctx, span, ok := c.start(ctx, query)
	row := c.Conn.QueryRow(ctx, query, args...)
	if ok {
		end(span, row.Err())
	}
	return row
}

func (c tracedConn) Exec(ctx context.Context, query string, args ...any) error {
	ctx, span, ok := c.start(ctx, query)
	err := c.Conn.Exec(ctx, query, args...)
	if ok {
		end(span, err)
	}
	return err
}

func (c tracedConn) PrepareBatch(ctx context.Context, query string, opts ...driver.PrepareBatchOption) (driver.Batch, error) {
	ctx, span, ok := c.start(ctx, query)
	b, err := c.Conn.PrepareBatch(ctx, query, opts...)
	if !ok {
		return b, err
	}
	if err != nil {
		end(span, err)
		return b, err
	}
	return &tracedBatch{Batch: b, span: span}, nil
}

// tracedRows ends its query's span when closed (or when iteration ends).
type tracedRows struct {
	driver.Rows
	span  trace.Span
	ended bool
}

func (r *tracedRows) Next() bool {
	more := r.Rows.Next()
	if !more {
		r.finish()
	}
	return more
}

func (r *tracedRows) Close() error {
	err := r.Rows.Close()
	r.finish()
	return err
}

func (r *tracedRows) finish() {
	if !r.ended {
		r.ended = true
		end(r.span, r.Rows.Err())
	}
}

// tracedBatch ends its INSERT's span when sent or aborted.
type tracedBatch struct {
	driver.Batch
	span  trace.Span
	ended bool
}

func (b *tracedBatch) Send() error {
	err := b.Batch.Send()
	if !b.ended {
		b.ended = true
		end(b.span, err)
	}
	return err
}

func (b *tracedBatch) Abort() error {
	err := b.Batch.Abort()
	if !b.ended {
		b.ended = true
		end(b.span, nil)
	}
	return err
}
