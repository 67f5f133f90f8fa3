package usage

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/ratewarden/ratewarden/schema"
)

// ErrUnavailable marks a store error that is the store's fault (unreachable,
// timed out, overloaded): the API answers 503 and the caller may retry.
var ErrUnavailable = errors.New("usage store unavailable")

// ValidDatabaseName reports whether name may be used as the ClickHouse
// database (it becomes SQL text, so it is checked once at start):
// schema.ValidDatabase, the rule of the migrations.
func ValidDatabaseName(name string) bool { return schema.ValidDatabase(name) }

// Store reads usage and keeps portal-token revocations in ClickHouse. It is
// safe for concurrent use.
type Store struct {
	conn driver.Conn
	db   string

	mu      sync.Mutex
	revoked map[string]bool      // ids known to be revoked (forever)
	checked map[string]time.Time // ids known not revoked, and when that was read
}

// revocationRecheck is how long "not revoked" is believed before ClickHouse
// is asked again: the longest a revocation made through another replica
// takes to reach this one.
const revocationRecheck = 2 * time.Second

// NewStore returns a Store over conn for database db.
func NewStore(conn driver.Conn, db string) (*Store, error) {
	if !ValidDatabaseName(db) {
		return nil, fmt.Errorf("invalid database name %q", db)
	}
	return &Store{conn: conn, db: db, revoked: map[string]bool{}, checked: map[string]time.Time{}}, nil
}

// wrap classifies a driver error: a server exception is a bug or bad data
// (500); anything else (network, timeout) means unavailable (503).
func wrap(op string, err error) error {
	var exc *clickhouse.Exception
	if errors.As(err, &exc) {
		return fmt.Errorf("%s: %w", op, err)
	}
	return fmt.Errorf("%s: %w: %v", op, ErrUnavailable, err)
}

// Counts are summed decision counters.
type Counts struct {
	Requests uint64 `json:"requests"`
	Allowed  uint64 `json:"allowed"`
	Rejected uint64 `json:"rejected"`
	Cost     uint64 `json:"cost"`
	Warnings uint64 `json:"warnings"`
}

func (c *Counts) add(o Counts) {
	c.Requests += o.Requests
	c.Allowed += o.Allowed
	c.Rejected += o.Rejected
	c.Cost += o.Cost
	c.Warnings += o.Warnings
}

// Point is one bucket of a usage series.
type Point struct {
	Start  time.Time
	Scope  string // "" when not grouped by scope
	Region string // "" when not grouped by region, or recorded without one
	Counts
}

// sub is c − o, field by field, never below 0.
func (c Counts) sub(o Counts) Counts {
	d := func(a, b uint64) uint64 {
		if a < b {
			return 0
		}
		return a - b
	}
	return Counts{d(c.Requests, o.Requests), d(c.Allowed, o.Allowed), d(c.Rejected, o.Rejected), d(c.Cost, o.Cost), d(c.Warnings, o.Warnings)}
}

func (s *Store) usage(ctx context.Context, q usageQuery) ([]Point, error) {
	sql, args := q.toSQL()
	rows, err := s.conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, wrap("usage query", err)
	}
	defer rows.Close()
	var out []Point
	for rows.Next() {
		var p Point
		var b uint32
		dest := []any{&b}
		if q.byScope {
			dest = append(dest, &p.Scope)
		}
		if q.byRegion {
			dest = append(dest, &p.Region)
		}
		dest = append(dest, &p.Requests, &p.Allowed, &p.Rejected, &p.Cost, &p.Warnings)
		if err := rows.Scan(dest...); err != nil {
			return nil, wrap("usage scan", err)
		}
		p.Start = time.Unix(int64(b), 0).UTC()
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("usage rows", err)
	}
	return out, nil
}

// usageByRegion is q's series per region: the per-region rollup's rows,
// and for each bucket (and scope) whose total in q's own rollup is more
// than its regions' sum, the difference as region "": usage recorded
// without a region (a one-region limiter, or before regions were
// recorded). The per-region rows come first in each bucket; two reads, so a
// batch the consumer wrote to one table and not yet to the other can show
// for a moment as region "" or be missing from it.
func (s *Store) usageByRegion(ctx context.Context, q usageQuery) ([]Point, error) {
	byRegion, err := s.usage(ctx, q)
	if err != nil || len(byRegion) > MaxPoints {
		return byRegion, err
	}
	q.byRegion = false
	totals, err := s.usage(ctx, q)
	if err != nil {
		return nil, err
	}
	type bucket struct {
		start time.Time
		scope string
	}
	summed := map[bucket]Counts{}
	for _, p := range byRegion {
		c := summed[bucket{p.Start, p.Scope}]
		c.add(p.Counts)
		summed[bucket{p.Start, p.Scope}] = c
	}
	out := make([]Point, 0, len(byRegion)+len(totals))
	i := 0
	for _, t := range totals {
		for i < len(byRegion) && !byRegion[i].Start.After(t.Start) {
			out = append(out, byRegion[i])
			i++
		}
		if rest := t.Counts.sub(summed[bucket{t.Start, t.Scope}]); rest != (Counts{}) {
			out = append(out, Point{Start: t.Start, Scope: t.Scope, Counts: rest})
		}
	}
	return append(out, byRegion[i:]...), nil
}

// KeyUsage is one row of the top-keys ranking.
type KeyUsage struct {
	Key      string `json:"key"`
	Requests uint64 `json:"requests"`
	Allowed  uint64 `json:"allowed"`
	Rejected uint64 `json:"rejected"`
	Cost     uint64 `json:"cost"`
}

func (s *Store) topKeys(ctx context.Context, q topKeysQuery) ([]KeyUsage, error) {
	sql, args := q.toSQL()
	rows, err := s.conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, wrap("top-keys query", err)
	}
	defer rows.Close()
	out := []KeyUsage{}
	for rows.Next() {
		var k KeyUsage
		if err := rows.Scan(&k.Key, &k.Requests, &k.Allowed, &k.Rejected, &k.Cost); err != nil {
			return nil, wrap("top-keys scan", err)
		}
		out = append(out, k)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("top-keys rows", err)
	}
	return out, nil
}

func (s *Store) totals(ctx context.Context, q totalsQuery) (Counts, error) {
	sql, args := q.toSQL()
	var c Counts
	if err := s.conn.QueryRow(ctx, sql, args...).Scan(&c.Requests, &c.Allowed, &c.Rejected, &c.Cost, &c.Warnings); err != nil {
		return Counts{}, wrap("totals query", err)
	}
	return c, nil
}

// Delivery is one recorded webhook delivery attempt.
type Delivery struct {
	DeliveryID  string    `json:"deliveryId"`
	Attempt     uint16    `json:"attempt"`
	Key         string    `json:"key"`
	Scope       string    `json:"scope"`
	Tier        string    `json:"tier"`
	URL         string    `json:"url"`
	EventID     string    `json:"eventId"`
	AttemptedAt time.Time `json:"attemptedAt"`
	StatusCode  uint16    `json:"statusCode"`
	Error       string    `json:"error,omitempty"`
	DurationMs  uint32    `json:"durationMs"`
	Outcome     string    `json:"outcome"`
}

func (s *Store) deliveries(ctx context.Context, q deliveriesQuery) ([]Delivery, error) {
	sql, args := q.toSQL()
	rows, err := s.conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, wrap("deliveries query", err)
	}
	defer rows.Close()
	out := []Delivery{}
	for rows.Next() {
		var d Delivery
		var ms uint64
		if err := rows.Scan(&d.DeliveryID, &d.Attempt, &d.Key, &d.Scope, &d.Tier, &d.URL, &d.EventID, &ms, &d.StatusCode, &d.Error, &d.DurationMs, &d.Outcome); err != nil {
			return nil, wrap("deliveries scan", err)
		}
		d.AttemptedAt = time.UnixMilli(int64(ms)).UTC()
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("deliveries rows", err)
	}
	return out, nil
}

func (s *Store) insertTokenEvent(ctx context.Context, id, key, event string, at, expires time.Time) error {
	// In cluster mode portal_token_events is a Distributed table, whose
	// inserts are queued on this node and sent to the shard later by
	// default: a revocation must be on its shard (and so visible to every
	// usage API) before it is acknowledged. Without effect on a MergeTree.
	ctx = clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"insert_distributed_sync": 1}))
	b, err := s.conn.PrepareBatch(ctx, fmt.Sprintf("INSERT INTO %s.%s (id, key, event, at, expires_at)", s.db, schema.PortalTokenEvents))
	if err != nil {
		return wrap("prepare token event", err)
	}
	if err := b.Append(id, key, event, at.UTC(), expires.UTC()); err != nil {
		_ = b.Abort()
		return fmt.Errorf("append token event: %w", err)
	}
	if err := b.Send(); err != nil {
		return wrap("insert token event", err)
	}
	return nil
}

// RecordIssued records that the token c was issued at.
func (s *Store) RecordIssued(ctx context.Context, c Claims, at time.Time) error {
	return s.insertTokenEvent(ctx, c.ID, c.Key, "issued", at, c.ExpiresAt())
}

// Revoke records the revocation of token id at. It reports false when no
// token with that id was ever issued.
func (s *Store) Revoke(ctx context.Context, id string, at time.Time) (bool, error) {
	var key string
	var expires time.Time
	q := fmt.Sprintf("SELECT key, expires_at FROM %s.%s WHERE id = ? AND event = 'issued' LIMIT 1", s.db, schema.PortalTokenEvents)
	rows, err := s.conn.Query(ctx, q, id)
	if err != nil {
		return false, wrap("find token", err)
	}
	found := false
	for rows.Next() {
		if err := rows.Scan(&key, &expires); err != nil {
			rows.Close()
			return false, wrap("find token scan", err)
		}
		found = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return false, wrap("find token rows", err)
	}
	if !found {
		return false, nil
	}
	if err := s.insertTokenEvent(ctx, id, key, "revoked", at, expires); err != nil {
		return false, err
	}
	s.mu.Lock()
	s.revoked[id] = true
	s.mu.Unlock()
	return true, nil
}

// IsRevoked reports whether token id has been revoked, at most
// revocationRecheck out of date for revocations made elsewhere.
func (s *Store) IsRevoked(ctx context.Context, id string, now time.Time) (bool, error) {
	s.mu.Lock()
	if s.revoked[id] {
		s.mu.Unlock()
		return true, nil
	}
	if at, ok := s.checked[id]; ok && now.Sub(at) < revocationRecheck && !now.Before(at) {
		s.mu.Unlock()
		return false, nil
	}
	s.mu.Unlock()

	var n uint64
	q := fmt.Sprintf("SELECT count() FROM %s.%s WHERE id = ? AND event = 'revoked'", s.db, schema.PortalTokenEvents)
	if err := s.conn.QueryRow(ctx, q, id).Scan(&n); err != nil {
		return false, wrap("revocation check", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if n > 0 {
		s.revoked[id] = true
		return true, nil
	}
	if len(s.checked) > 100000 {
		s.checked = map[string]time.Time{}
	}
	s.checked[id] = now
	return false, nil
}

// Ready reports why the store cannot serve, or nil: ClickHouse must answer
// and the tables the API reads must exist.
func (s *Store) Ready(ctx context.Context) error {
	if err := s.conn.Ping(ctx); err != nil {
		return wrap("ping clickhouse", err)
	}
	var n uint64
	err := s.conn.QueryRow(ctx, "SELECT count() FROM system.tables WHERE database = ? AND name IN (?, ?, ?, ?, ?)", s.db,
		schema.UsageMinute, schema.UsageHour, schema.UsageDay, schema.PortalTokenEvents, schema.WebhookDeliveries).Scan(&n)
	if err != nil {
		return wrap("list tables", err)
	}
	if n < 5 {
		return fmt.Errorf("schema not applied yet: %d of 5 tables present in %s", n, s.db)
	}
	return nil
}
