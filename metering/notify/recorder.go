package notify

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/ratewarden/ratewarden/schema"
)

// Attempt is one recorded delivery attempt (a row of webhook_deliveries).
type Attempt struct {
	DeliveryID  string
	Attempt     uint16
	Key         string
	Scope       string
	Tier        string
	URL         string // without query or user info
	EventID     string
	EventTS     uint64 // ms since the epoch
	AttemptedAt time.Time
	StatusCode  uint16 // 0 = no HTTP response
	Error       string
	DurationMs  uint32
	Outcome     string // delivered | retrying | failed | abandoned
}

// recorder writes attempts to ClickHouse from one goroutine, batched by size
// and time. It never blocks a delivery: when its queue is full, the attempt
// is dropped and counted; a failed insert is retried on the next flush
// while at most maxPending rows wait.
type recorder struct {
	conn    driver.Conn
	db      string
	log     *slog.Logger
	in      chan Attempt
	every   time.Duration
	dropped func()
	failing atomic.Value // string: the last insert error, "" once an insert succeeds
}

const maxPending = 10000

func (r *recorder) record(a Attempt) {
	select {
	case r.in <- a:
	default:
		r.dropped()
	}
}

// run flushes until ctx ends, then flushes what is left (bounded by 2 s).
func (r *recorder) run(ctx context.Context) {
	t := time.NewTicker(r.every)
	defer t.Stop()
	var pending []Attempt
	flush := func(fctx context.Context) {
		if len(pending) == 0 {
			return
		}
		if err := r.insert(fctx, pending); err != nil {
			r.failing.Store(err.Error())
			r.log.Warn("record webhook attempts; will retry", "rows", len(pending), "err", err)
			if len(pending) > maxPending {
				for range pending[:len(pending)-maxPending] {
					r.dropped()
				}
				pending = append([]Attempt(nil), pending[len(pending)-maxPending:]...)
			}
			return
		}
		r.failing.Store("")
		pending = pending[:0]
	}
	for {
		select {
		case a := <-r.in:
			pending = append(pending, a)
			if len(pending) >= 1000 {
				flush(ctx)
			}
		case <-t.C:
			flush(ctx)
		case <-ctx.Done():
			for {
				select {
				case a := <-r.in:
					pending = append(pending, a)
					continue
				default:
				}
				break
			}
			fctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			flush(fctx)
			cancel()
			return
		}
	}
}

func (r *recorder) insert(ctx context.Context, rows []Attempt) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	b, err := r.conn.PrepareBatch(ctx, "INSERT INTO "+r.db+"."+schema.WebhookDeliveries+" (delivery_id, attempt, key, scope, tier, url, event_id, event_ts, attempted_at, attempted_ms, status_code, error, duration_ms, outcome)")
	if err != nil {
		return fmt.Errorf("prepare: %w", err)
	}
	for _, a := range rows {
		if err := b.Append(a.DeliveryID, a.Attempt, a.Key, a.Scope, a.Tier, a.URL, a.EventID, a.EventTS,
			a.AttemptedAt.UTC(), uint64(a.AttemptedAt.UnixMilli()), a.StatusCode, a.Error, a.DurationMs, a.Outcome); err != nil {
			_ = b.Abort()
			return fmt.Errorf("append: %w", err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	return nil
}

// recentDeliveries returns, per key and scope, the latest event time (ms) of
// a notification first attempted within since: the cool-downs to restore
// after a restart.
func recentDeliveries(ctx context.Context, conn driver.Conn, db string, since time.Time) (map[string]int64, error) {
	rows, err := conn.Query(ctx, "SELECT key, scope, max(event_ts) FROM "+db+"."+schema.WebhookDeliveries+" WHERE attempt = 1 AND attempted_at >= toDateTime(?) GROUP BY key, scope", since.Unix())
	if err != nil {
		return nil, fmt.Errorf("recent deliveries: %w", err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var key, scope string
		var ts uint64
		if err := rows.Scan(&key, &scope, &ts); err != nil {
			return nil, fmt.Errorf("recent deliveries: %w", err)
		}
		out[pairKey(key, scope)] = int64(ts)
	}
	return out, rows.Err()
}
