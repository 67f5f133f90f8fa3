// Package chaudit writes every record of the policy log, applied or
// refused, into ClickHouse table policy_audit (schema/0053), and reads it
// back. The writer replays the log from its start by the apply rule (so a
// row's result is what every limiter decided) and inserts the entries
// after the last offset the table holds.
//
// A log can start over (a development broker that keeps nothing, a topic
// deleted and created again): its offsets begin again at 0, below the rows
// the table holds. The writer then starts a new epoch (schema/0055): the
// new log's rows get positions after every row of the old one
// (kafka_offset = log_offset + the epoch's first position), so the old
// log's audit is kept and the new log is audited from its first record,
// neither skipped nor written over the old rows that share its offsets.
package chaudit

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/internal/promdecl"
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
	// Keys, when set, is the readers' keyring: records are judged by it
	// as the limiters judge them (policylog.Keyring), so the audit says
	// unauthenticated where they refuse a record as such, and the author
	// of the rest is their key's identity.
	Keys *policylog.Keyring
}

// Writer is the audit writer. Run does the work; Ready is safe from any
// goroutine.
type Writer struct {
	cfg    Config
	rows   prometheus.Counter
	errs   prometheus.Counter
	unauth prometheus.Counter
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
		rows:   promdecl.Counter("meter_policy_audit_rows_total", "Policy log records written to policy_audit."),
		errs:   promdecl.Counter("meter_policy_audit_errors_total", "Failed reads of the policy log or writes of policy_audit; retried."),
		unauth: promdecl.Counter("meter_policy_audit_unauthenticated_total", "Policy log records read that the keyring (POLICY_TRUSTED_KEYS_FILE) refuses: unsigned, signed by an unknown or retired key, or altered."),
	}
	if cfg.Registry != nil {
		cfg.Registry.MustRegister(w.rows, w.errs, w.unauth)
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
		if errors.Is(err, errStartedOver) {
			continue // not a failure: resume audits the new log as a new epoch
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

// errStartedOver: the log now ends before an offset already read, so it is
// another log; follow ends and resume starts a new epoch.
var errStartedOver = policylog.ErrStartedOver

func (w *Writer) follow(ctx context.Context) error {
	cur, err := w.resume(ctx)
	if err != nil {
		return err
	}
	var pending []row
	c := policylog.NewClient(w.cfg.Log, false)
	c.Authenticate(w.cfg.Keys)
	c.NoCheckpoints = true // every record audited with its own verdict
	c.OnApply = func(e policylog.Entry, o policylog.Outcome) {
		if o.Code == policylog.CodeUnauthenticated {
			w.unauth.Inc()
		}
		if e.Offset >= cur.next {
			pending = append(pending, row{e, o})
		}
	}
	for ctx.Err() == nil {
		caughtUp, err := c.Poll(ctx)
		if err != nil {
			if errors.Is(err, errStartedOver) {
				return err
			}
			return fmt.Errorf("read the policy log: %w", err)
		}
		if len(pending) > 0 {
			if err := w.insert(ctx, cur, pending); err != nil {
				return err
			}
			w.rows.Add(float64(len(pending)))
			cur.next = pending[len(pending)-1].e.Offset + 1
			pending = pending[:0]
		}
		if caughtUp {
			ok := ""
			w.status.Store(&ok)
		}
	}
	return nil
}

// cursor is where the writer stands: the epoch of the log it reads, the
// position of that log's offset 0 (base), and the next offset to audit.
type cursor struct {
	epoch uint32
	base  int64
	next  int64
}

// resume finds where to go on from the table's last row: after it, when
// the log still holds that record (or compaction removed it); else the log
// started over, and its every record is audited as a new epoch whose
// positions follow the last row's.
func (w *Writer) resume(ctx context.Context) (cursor, error) {
	qctx, cancel := context.WithTimeout(ctx, w.cfg.Timeout)
	defer cancel()
	q := fmt.Sprintf("SELECT kafka_offset, log_epoch, log_offset, content FROM %s.%s ORDER BY kafka_offset DESC LIMIT 1", w.cfg.Database, Table)
	rs, err := w.cfg.Conn.Query(qctx, q)
	if err != nil {
		return cursor{}, fmt.Errorf("read %s: %w", Table, err)
	}
	defer rs.Close()
	if !rs.Next() {
		if err := rs.Err(); err != nil {
			return cursor{}, fmt.Errorf("read %s: %w", Table, err)
		}
		return cursor{}, nil
	}
	var pos uint64
	var epoch uint32
	var off int64
	var content string
	if err := rs.Scan(&pos, &epoch, &off, &content); err != nil {
		return cursor{}, fmt.Errorf("read %s: %w", Table, err)
	}
	cur := cursor{epoch: epoch, base: int64(pos) - off, next: off + 1}
	entries, end, err := w.cfg.Log.Fetch(ctx, off)
	if err != nil {
		return cursor{}, fmt.Errorf("read the policy log: %w", err)
	}
	reason := ""
	if end <= off {
		reason = "restarted" // the log ends before the last record audited
	}
	for _, e := range entries {
		if e.Offset == off && string(e.Value) != content {
			reason = "replaced" // another record at that offset: the log was recreated and grew past it
		}
	}
	if reason == "" {
		return cur, nil
	}
	next := cursor{epoch: epoch + 1, base: int64(pos) + 1}
	w.cfg.Logger.Info("policy log started over: auditing it as a new epoch", "reason", reason,
		"epoch", next.epoch, "first_position", next.base, "last_offset_audited", off, "log_end", end)
	return next, nil
}

func (w *Writer) insert(ctx context.Context, cur cursor, rows []row) error {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.Timeout)
	defer cancel()
	b, err := w.cfg.Conn.PrepareBatch(ctx, fmt.Sprintf("INSERT INTO %s.%s (kafka_offset, log_key, revision, parent, kind, subject, author, message, time, hash, content, result, code, reason, recorded_at, log_epoch, log_offset)", w.cfg.Database, Table))
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
		if err := b.Append(uint64(cur.base+r.e.Offset), r.e.Key, rec.Revision, rec.Parent, rec.Kind, subject, rec.Author, rec.Message,
			t, rec.SHA256, string(r.e.Value), r.o.Result, r.o.Code, r.o.Reason, now, cur.epoch, r.e.Offset); err != nil {
			return fmt.Errorf("insert into %s: %w", Table, err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("insert into %s: %w", Table, err)
	}
	return nil
}

// Row is one audited record, as read back. Offset is its position (the
// log offset, plus the epoch's first position once the log started over);
// Epoch and LogOffset say which log and where in it.
type Row struct {
	Offset    int64     `json:"offset"`
	Epoch     uint32    `json:"epoch"`
	LogOffset int64     `json:"logOffset"`
	LogKey    string    `json:"logKey"`
	Revision  int64     `json:"revision"`
	Parent    int64     `json:"parent"`
	Kind      string    `json:"kind"`
	Subject   string    `json:"subject"`
	Author    string    `json:"author"`
	Message   string    `json:"message"`
	Time      time.Time `json:"time"`
	Hash      string    `json:"sha256"`
	Content   string    `json:"content"`
	Result    string    `json:"result"`
	Code      string    `json:"code,omitempty"`
	Reason    string    `json:"reason,omitempty"`
}

// Query reads the audit: the newest limit rows, optionally only those of
// one revision (revision > 0), newest first.
func Query(ctx context.Context, conn driver.Conn, database string, revision int64, limit int) ([]Row, error) {
	q := fmt.Sprintf("SELECT kafka_offset, log_epoch, log_offset, log_key, revision, parent, kind, subject, author, message, time, hash, content, result, code, reason FROM %s.%s FINAL", database, Table)
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
		if err := rs.Scan(&off, &r.Epoch, &r.LogOffset, &r.LogKey, &r.Revision, &r.Parent, &r.Kind, &r.Subject, &r.Author, &r.Message, &r.Time, &r.Hash, &r.Content, &r.Result, &r.Code, &r.Reason); err != nil {
			return nil, err
		}
		r.Offset = int64(off)
		out = append(out, r)
	}
	return out, rs.Err()
}

// InForce rebuilds, from policy_audit alone, the state of the policy log
// in force at instant at: the log (epoch) written then, its records
// applied by the apply rule in log order, up to the last one written at
// or before at. The document is nil (State.Snapshot is nil) when none was
// in force yet. It answers "which policy decided then" also for records
// compaction has removed from the topic. The epoch is the last one whose
// first record was written at or before at (records carry their writer's
// clock). A record audited as unauthenticated stays refused.
func InForce(ctx context.Context, conn driver.Conn, database string, at time.Time) (*policylog.State, uint32, error) {
	return stateAt(ctx, conn, database, at, false)
}

// InForceRecords is InForce with a State that keeps every override's
// record, as `limiter policy restore` writes them back into a lost log.
func InForceRecords(ctx context.Context, conn driver.Conn, database string, at time.Time) (*policylog.State, uint32, error) {
	return stateAt(ctx, conn, database, at, true)
}

func stateAt(ctx context.Context, conn driver.Conn, database string, at time.Time, keep bool) (*policylog.State, uint32, error) {
	q := fmt.Sprintf("SELECT log_epoch FROM %s.%s GROUP BY log_epoch HAVING min(time) <= toDateTime(?) ORDER BY log_epoch DESC LIMIT 1", database, Table)
	var epoch uint32
	st := policylog.NewState(keep)
	if err := conn.QueryRow(ctx, q, uint32(at.Unix())).Scan(&epoch); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return st, 0, nil
		}
		return nil, 0, fmt.Errorf("read %s: %w", Table, err)
	}
	q = fmt.Sprintf("SELECT log_offset, log_key, content, code FROM %s.%s FINAL WHERE log_epoch = ? ORDER BY kafka_offset", database, Table)
	rs, err := conn.Query(ctx, q, epoch)
	if err != nil {
		return nil, 0, fmt.Errorf("read %s: %w", Table, err)
	}
	defer rs.Close()
	for rs.Next() {
		var e policylog.Entry
		var content, code string
		if err := rs.Scan(&e.Offset, &e.Key, &content, &code); err != nil {
			return nil, 0, fmt.Errorf("read %s: %w", Table, err)
		}
		// A record refused as unauthenticated when it was audited stays
		// refused: the audit holds the keyring's judgement, and a refusal
		// changes no state, as a tombstone does not.
		if content != "" && code != policylog.CodeUnauthenticated { // "" is a tombstone's
			e.Value = []byte(content)
			if rec, err := policylog.Decode(e.Key, e.Value); err == nil && rec.Time.After(at) {
				break // written after at: the log then ended before it
			}
		}
		st.Apply(e)
	}
	if err := rs.Err(); err != nil {
		return nil, 0, fmt.Errorf("read %s: %w", Table, err)
	}
	return st, epoch, nil
}
