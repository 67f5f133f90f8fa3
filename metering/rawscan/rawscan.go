// Package rawscan streams recorded decisions, settles and charges out of
// ClickHouse's decisions_raw table in time order, for `limiter policy
// replay`. Values are
// always bound arguments (client-side binding: 18.16 has no server-side
// parameters); rows are read block by block as the driver receives them,
// never gathered, and the range is read in windows so that no query asks the
// server to sort more than one window.
package rawscan

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/ratewarden/ratewarden/schema"
)

// Row is one recorded event, as replay needs it: a decision, or (Kind) a
// settle or a charge.
type Row struct {
	TS      int64 // ms since the epoch
	Key     string
	Scope   string
	Tier    string
	Cost    int64
	Allowed bool
	Source  string
	Policy  string
	DryRun  bool
	// PolicyRevision is the policy log's revision in force (0: none
	// recorded); DecidedUS the instant the store decided a shared
	// decision, µs since the epoch (0: none recorded).
	PolicyRevision int64
	DecidedUS      int64
	// Kind is "decision", "settle" or "charge" (rows written before
	// decisions_raw had the column read "decision"). Reservation is the id
	// of a reserving decision and of its settle; Estimate and Actual are a
	// settle's estimate and actual cost, Actual a charge's cost.
	Kind        string
	Reservation string
	Estimate    int64
	Actual      int64
	// Priority is the request's priority class ("" when it named none and
	// was not shed).
	Priority string
}

// Query is one range of decisions_raw.
type Query struct {
	Database string    // validated identifier
	From, To time.Time // [From, To)
	// Sample is the fraction of keys read, in (0, 1]; 0 means 1. Sampling
	// is by key (a hash of it), so a sampled key's decisions are all
	// there and its buckets replay exactly; counts scale by 1/Sample.
	Sample float64
}

// notCorrection leaves out an operator's corrections (kind 'correction',
// metering/billing): they are not traffic a policy decides, and a replay
// would take them for decisions.
const notCorrection = " AND kind != 'correction'"

// sampleBuckets is the resolution of Sample: keys are kept when
// cityHash64(key) % sampleBuckets < Sample × sampleBuckets.
const sampleBuckets = 1_000_000

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// toSQL is the statement and its bound arguments for [from, to).
// ORDER BY the instant the store decided (decided_us; for a decision
// without one, ts), then the Kafka position: the store's order is the
// order its buckets changed in, which two limiters racing on one key may
// have emitted the other way round; one key's events are in one partition
// in emission order. Decisions of one batch share the store's instant (it
// reads the clock once per batch) and ran in the batch's order, which the
// events do not record; at one instant a bucket's remaining tokens only
// fall, and a rejection leaves them as they were, so remaining DESC, then
// the allowed first, is that order (exact for equal costs; a settle that
// shares a batch's instant is placed by the same rule, which holds for a
// charge beyond its estimate and may place a refund early). A settle or a
// charge carries the instant its store applied it. event_time bounds the scan to the partitions
// (months) of the range; ts bounds it to the millisecond (the windows of
// a scan are by ts, so only decisions the store took in another order
// across a window's edge are read in ts order).
func (q Query) toSQL(from, to time.Time) (string, []any) {
	sql := "SELECT ts, key, scope, tier, cost, allowed, source, policy, dry_run, policy_revision, decided_us, kind, reservation, estimate, actual, priority FROM " + q.Database + "." + schema.DecisionsRaw +
		" WHERE event_time >= toDateTime(?) AND event_time <= toDateTime(?) AND ts >= ? AND ts < ?" + notCorrection
	args := []any{uint32(from.Unix()), uint32(to.Unix()), uint64(from.UnixMilli()), uint64(to.UnixMilli())}
	if s := q.Sample; s > 0 && s < 1 {
		sql += " AND cityHash64(key) % ? < ?"
		args = append(args, uint64(sampleBuckets), uint64(math.Ceil(s*sampleBuckets)))
	}
	return sql + " ORDER BY ifNull(decided_us, toInt64(ts) * 1000), remaining DESC, allowed DESC, kafka_partition, kafka_offset", args
}

// countSQL counts the rows of [q.From, q.To) (Sample ignored), settles and
// charges included: what a bounded replay reads first, to pick a sample
// that fits its row budget.
func (q Query) countSQL() (string, []any) {
	return "SELECT count() FROM " + q.Database + "." + schema.DecisionsRaw +
			" WHERE event_time >= toDateTime(?) AND event_time <= toDateTime(?) AND ts >= ? AND ts < ?" + notCorrection,
		[]any{uint32(q.From.Unix()), uint32(q.To.Unix()), uint64(q.From.UnixMilli()), uint64(q.To.UnixMilli())}
}

// Count is the number of rows (decisions, settles and charges) recorded in
// [q.From, q.To), every key.
func Count(ctx context.Context, conn driver.Conn, q Query) (uint64, error) {
	if err := q.Validate(); err != nil {
		return 0, fmt.Errorf("rawscan: %w", err)
	}
	sql, args := q.countSQL()
	var n uint64
	if err := conn.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("rawscan: count decisions_raw: %w", err)
	}
	return n, nil
}

// Validate reports every problem with q at once.
func (q Query) Validate() error {
	var errs []error
	if !identifier.MatchString(q.Database) {
		errs = append(errs, fmt.Errorf("database %q is not an identifier", q.Database))
	}
	if !q.From.Before(q.To) {
		errs = append(errs, fmt.Errorf("the range is empty: from %s is not before to %s", q.From.Format(time.RFC3339), q.To.Format(time.RFC3339)))
	}
	if q.Sample < 0 || q.Sample > 1 || math.IsNaN(q.Sample) {
		errs = append(errs, fmt.Errorf("sample must be in (0, 1], got %v", q.Sample))
	}
	return errors.Join(errs...)
}

// Scan calls fn for every row of q in time order, reading window by window
// (each window one query, its rows streamed). Each query gets its own
// deadline, queryTimeout. It stops at the first error, fn's included.
func Scan(ctx context.Context, conn driver.Conn, q Query, window, queryTimeout time.Duration, fn func(*Row) error) error {
	if err := q.Validate(); err != nil {
		return fmt.Errorf("rawscan: %w", err)
	}
	if window <= 0 {
		window = time.Hour
	}
	var r Row
	for from := q.From; from.Before(q.To); from = from.Add(window) {
		to := from.Add(window)
		if to.After(q.To) {
			to = q.To
		}
		if err := scanWindow(ctx, conn, q, from, to, queryTimeout, &r, fn); err != nil {
			return err
		}
	}
	return nil
}

func scanWindow(ctx context.Context, conn driver.Conn, q Query, from, to time.Time, timeout time.Duration, r *Row, fn func(*Row) error) error {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	sql, args := q.toSQL(from, to)
	rows, err := conn.Query(ctx, sql, args...)
	if err != nil {
		return fmt.Errorf("rawscan: query decisions_raw [%s, %s): %w", from.Format(time.RFC3339), to.Format(time.RFC3339), err)
	}
	defer rows.Close()
	var ts, cost, estimate, actual uint64
	var allowed, dryRun uint8
	var rev, decided *int64
	for rows.Next() {
		if err := rows.Scan(&ts, &r.Key, &r.Scope, &r.Tier, &cost, &allowed, &r.Source, &r.Policy, &dryRun, &rev, &decided,
			&r.Kind, &r.Reservation, &estimate, &actual, &r.Priority); err != nil {
			return fmt.Errorf("rawscan: read decisions_raw: %w", err)
		}
		r.TS, r.Cost, r.Allowed, r.DryRun = int64(ts), int64(min(cost, math.MaxInt64)), allowed == 1, dryRun == 1
		r.Estimate, r.Actual = int64(min(estimate, math.MaxInt64)), int64(min(actual, math.MaxInt64))
		r.PolicyRevision, r.DecidedUS = 0, 0
		if rev != nil {
			r.PolicyRevision = *rev
		}
		if decided != nil {
			r.DecidedUS = *decided
		}
		if err := fn(r); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("rawscan: read decisions_raw [%s, %s): %w", from.Format(time.RFC3339), to.Format(time.RFC3339), err)
	}
	return nil
}
