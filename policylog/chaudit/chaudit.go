// Package chaudit writes every record of the policy log, applied or
// refused, into ClickHouse table policy_audit (schema/0053), and reads it
// back. The writer replays the log from its start by the apply rule (so a
// row's result is what every limiter decided) and inserts the entries
// after the last offset the table holds.
package chaudit

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/policylog"
)

// Table is the audit table's name.
const Table = "policy_audit"

// Config configures a Writer.
type Config struct {
	Log      policylog.Log // required
	Conn     driver.Conn   // required
	Database string        // required
	Logger   *slog.Logger  // required
	Registry prometheus.Registerer
	// Timeout bounds one ClickHouse statement (default 10 s).
	Timeout time.Duration
	// Absent, when set, says an error means the log does not exist yet
	// (no writer created it): nothing to audit, not a failure.
	Absent func(error) bool
}

// Writer is the audit writer. Run does the work; Ready is safe from any
// goroutine.
type Writer struct {
	cfg    Config
	rows   prometheus.Counter
	errs   prometheus.Counter
	status atomic.Pointer[string] // "" = ok
}

// New validates cfg and registers meter_policy_audit_rows_total and
// meter_policy_audit_errors_total.
func New(cfg Config) (*Writer, error) {
	if cfg.Log == nil || cfg.Conn == nil || cfg.Database == "" || cfg.Logger == nil {
		return nil, fmt.Errorf("chaudit: Log, Conn, Database and Logger are required")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	w := &Writer{cfg: cfg,
		rows: prometheus.NewCounter(prometheus.CounterOpts{Name: "meter_policy_audit_rows_total", Help: "Policy log records written to policy_audit."}),
		errs: prometheus.NewCounter(prometheus.CounterOpts{Name: "meter_policy_audit_errors_total", Help: "Failed reads of the policy log or writes of policy_audit; retried."}),
	}
	if cfg.Registry != nil {
		cfg.Registry.MustRegister(w.rows, w.errs)
	}
	starting := "policy audit: not caught up yet"
	w.status.Store(&starting)
	return w, nil
}

// Ready is false, with the reason, while the writer fails.
func (w *Writer) Ready() (bool, string) {
	s := *w.status.Load()
	return s == "", s
}

// Run follows the log until ctx ends. On a failure it waits a second and
// starts over (re-reading the table's last offset and the log).
func (w *Writer) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		err := w.follow(ctx)
		if ctx.Err() != nil {
			break
		}
		if w.cfg.Absent != nil && w.cfg.Absent(err) {
			ok := ""
			w.status.Store(&ok)
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Second):
			}
			continue
		}
		w.errs.Inc()
		msg := "policy audit: " + err.Error()
		if *w.status.Load() != msg {
			w.cfg.Logger.Warn("policy audit failing; retrying", "err", err)
		}
		w.status.Store(&msg)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	return nil
}

type row struct {
	e policylog.Entry
	o policylog.Outcome
}

func (w *Writer) follow(ctx context.Context) error {
	next, err := w.resume(ctx)
	if err != nil {
		return err
	}
	var pending []row
	c := policylog.NewClient(w.cfg.Log, false)
	c.OnApply = func(e policylog.Entry, o policylog.Outcome) {
		if e.Offset >= next {
			pending = append(pending, row{e, o})
		}
	}
	for ctx.Err() == nil {
		caughtUp, err := c.Poll(ctx)
		if err != nil {
			return fmt.Errorf("read the policy log: %w", err)
		}
		if len(pending) > 0 {
			if err := w.insert(ctx, pending); err != nil {
				return err
			}
			w.rows.Add(float64(len(pending)))
			next = pending[len(pending)-1].e.Offset + 1
			pending = pending[:0]
		}
		if caughtUp {
			ok := ""
			w.status.Store(&ok)
		}
	}
	return nil
}

// resume is the offset after the last one the table holds (0 when empty).
func (w *Writer) resume(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.Timeout)
	defer cancel()
	var n, maxOff uint64
	q := fmt.Sprintf("SELECT count(), max(kafka_offset) FROM %s.%s", w.cfg.Database, Table)
	if err := w.cfg.Conn.QueryRow(ctx, q).Scan(&n, &maxOff); err != nil {
		return 0, fmt.Errorf("read %s: %w", Table, err)
	}
	if n == 0 {
		return 0, nil
	}
	return int64(maxOff) + 1, nil
}

func (w *Writer) insert(ctx context.Context, rows []row) error {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.Timeout)
	defer cancel()
	b, err := w.cfg.Conn.PrepareBatch(ctx, fmt.Sprintf("INSERT INTO %s.%s (kafka_offset, log_key, revision, parent, kind, subject, author, message, time, hash, content, result, code, reason, recorded_at)", w.cfg.Database, Table))
	if err != nil {
		return fmt.Errorf("insert into %s: %w", Table, err)
	}
	now := time.Now().UTC()
	for _, r := range rows {
		rec := r.o.Record
		t := rec.Time.UTC()
		if t.Before(time.Unix(0, 0)) || t.After(time.Date(2105, 1, 1, 0, 0, 0, 0, time.UTC)) {
			t = time.Unix(0, 0).UTC() // DateTime's range; a garbled record has none
		}
		subject := ""
		if rec.Kind != "" {
			subject = rec.Subject()
		}
		if err := b.Append(uint64(r.e.Offset), r.e.Key, rec.Revision, rec.Parent, rec.Kind, subject, rec.Author, rec.Message,
			t, rec.SHA256, string(r.e.Value), r.o.Result, r.o.Code, r.o.Reason, now); err != nil {
			return fmt.Errorf("insert into %s: %w", Table, err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("insert into %s: %w", Table, err)
	}
	return nil
}

// Row is one audited record, as read back.
type Row struct {
	Offset   int64     `json:"offset"`
	LogKey   string    `json:"logKey"`
	Revision int64     `json:"revision"`
	Parent   int64     `json:"parent"`
	Kind     string    `json:"kind"`
	Subject  string    `json:"subject"`
	Author   string    `json:"author"`
	Message  string    `json:"message"`
	Time     time.Time `json:"time"`
	Hash     string    `json:"sha256"`
	Content  string    `json:"content"`
	Result   string    `json:"result"`
	Code     string    `json:"code,omitempty"`
	Reason   string    `json:"reason,omitempty"`
}

// Query reads the audit: the newest limit rows, optionally only those of
// one revision (revision > 0), newest first.
func Query(ctx context.Context, conn driver.Conn, database string, revision int64, limit int) ([]Row, error) {
	q := fmt.Sprintf("SELECT kafka_offset, log_key, revision, parent, kind, subject, author, message, time, hash, content, result, code, reason FROM %s.%s FINAL", database, Table)
	var args []any
	if revision > 0 {
		q += " WHERE revision = ?"
		args = append(args, revision)
	}
	q += " ORDER BY kafka_offset DESC LIMIT ?" // the offset is the log's order
	args = append(args, limit)
	rs, err := conn.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	var out []Row
	for rs.Next() {
		var r Row
		var off uint64
		if err := rs.Scan(&off, &r.LogKey, &r.Revision, &r.Parent, &r.Kind, &r.Subject, &r.Author, &r.Message, &r.Time, &r.Hash, &r.Content, &r.Result, &r.Code, &r.Reason); err != nil {
			return nil, err
		}
		r.Offset = int64(off)
		out = append(out, r)
	}
	return out, rs.Err()
}
