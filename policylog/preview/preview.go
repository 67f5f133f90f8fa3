// Package preview answers, before a policy push is written, "what would
// this candidate newly reject?": the decisions recorded in ClickHouse over
// the last window (decisions_raw, as `limiter policy replay` reads them)
// are replayed under the candidate (enforcement/replay), and the report
// counts those that were allowed then and that the candidate rejects.
//
// Its cost is bounded three ways, each said in the Result: a row budget
// (MaxRows) that picks a sample of keys when the window holds more (by key,
// so a sampled key replays exactly; counts are of the sample), a hard stop
// at the budget when a few hot keys exceed it anyway (Capped: the rows
// after CoveredTo are not replayed), and the caller's context deadline,
// which ends the queries (Partial: what was replayed until then).
package preview

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/ratewarden/ratewarden/enforcement/replay"
	"github.com/ratewarden/ratewarden/metering/rawscan"
)

// Config bounds a preview. The zero value of each field is a documented
// default.
type Config struct {
	Database string        // ClickHouse database of decisions_raw (required)
	Window   time.Duration // how far back from now (default 1 h)
	MaxRows  int64         // row budget (default 500,000)
	TopKeys  int           // keys listed (default 10)
}

// Result is what a push prints before it writes, and its JSON.
type Result struct {
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
	// Decisions replayed; NewlyRejected of them were allowed then and the
	// candidate rejects them; Share is NewlyRejected ÷ Decisions.
	Decisions     int64   `json:"decisions"`
	NewlyRejected int64   `json:"newlyRejected"`
	Share         float64 `json:"newlyRejectedShare"`
	NewlyAllowed  int64   `json:"newlyAllowed"`
	// Recorded is every row of the window (decisions, settles and
	// charges), sampled or not; Sample the fraction of keys replayed (1 =
	// every key).
	Recorded uint64  `json:"recorded"`
	Sample   float64 `json:"sample"`
	// Capped: the row budget stopped the replay; the decisions after
	// CoveredTo were not replayed. Partial: the deadline did.
	Capped    bool      `json:"capped,omitempty"`
	Partial   bool      `json:"partial,omitempty"`
	CoveredTo time.Time `json:"coveredTo,omitzero"`
	// Rules are the candidate's rules that newly reject, the most first.
	Rules   []Rule             `json:"rules"`
	TopKeys []replay.KeyCounts `json:"topKeys"`
	Seconds float64            `json:"seconds"`
}

// Outcome is a preview as a write's answer carries it (the CLI's --json,
// the operator API's "preview").
type Outcome struct {
	// Status: replayed, skipped (not asked for) or unavailable (ClickHouse
	// unreachable or not set up: the write went on without a preview).
	Status string `json:"status"`
	Reason string `json:"reason,omitempty"`
	*Result
}

// Outcome statuses.
const (
	Replayed    = "replayed"
	Skipped     = "skipped"
	Unavailable = "unavailable"
)

// Rule is one rule's part of the newly rejected decisions.
type Rule struct {
	Name          string `json:"name"`
	Decisions     int64  `json:"decisions"`
	NewlyRejected int64  `json:"newlyRejected"`
}

// errBudget stops a scan at the row budget.
var errBudget = errors.New("preview: row budget reached")

// Run replays [now-Window, now) under candidate. It returns an error only
// when nothing could be replayed (ClickHouse unreachable, the table
// missing); a deadline reached mid-scan gives a Partial result.
func Run(ctx context.Context, conn driver.Conn, cfg Config, candidate replay.Resolver, now time.Time) (Result, error) {
	if cfg.Window <= 0 {
		cfg.Window = time.Hour
	}
	if cfg.MaxRows <= 0 {
		cfg.MaxRows = 500_000
	}
	if cfg.TopKeys <= 0 {
		cfg.TopKeys = 10
	}
	began := time.Now()
	q := rawscan.Query{Database: cfg.Database, From: now.Add(-cfg.Window).UTC(), To: now.UTC(), Sample: 1}
	res := Result{From: q.From, To: q.To, Sample: 1, Rules: []Rule{}}
	n, err := rawscan.Count(ctx, conn, q)
	if err != nil {
		return res, err
	}
	res.Recorded = n
	if n > uint64(cfg.MaxRows) {
		// Sampled by key: the budget's share of the keys, whose buckets
		// then replay exactly.
		q.Sample = float64(cfg.MaxRows) / float64(n)
		res.Sample = q.Sample
	}
	eng := replay.New(replay.Config{Policy: candidate, TopKeys: cfg.TopKeys, TopNewlyRejected: true})
	var rows int64
	var last int64
	err = rawscan.Scan(ctx, conn, q, cfg.Window, 0, func(r *rawscan.Row) error {
		if rows >= cfg.MaxRows {
			return errBudget
		}
		rows++
		last = r.TS
		eng.Add(ReplayRow(r))
		return nil
	})
	switch {
	case errors.Is(err, errBudget):
		res.Capped = true
	case err != nil && ctx.Err() != nil && rows > 0:
		res.Partial = true
	case err != nil:
		return res, err
	}
	if res.Capped || res.Partial {
		res.CoveredTo = time.UnixMilli(last).UTC()
	}
	rep := eng.Report()
	res.Decisions, res.NewlyRejected, res.NewlyAllowed = rep.Total.Decisions, rep.Total.NewlyRejected, rep.Total.NewlyAllowed
	if res.Decisions > 0 {
		res.Share = float64(res.NewlyRejected) / float64(res.Decisions)
	}
	for name, c := range rep.Rules {
		if c.NewlyRejected > 0 {
			res.Rules = append(res.Rules, Rule{Name: name, Decisions: c.Decisions, NewlyRejected: c.NewlyRejected})
		}
	}
	sort.Slice(res.Rules, func(i, j int) bool {
		a, b := res.Rules[i], res.Rules[j]
		if a.NewlyRejected != b.NewlyRejected {
			return a.NewlyRejected > b.NewlyRejected
		}
		return a.Name < b.Name
	})
	if len(res.Rules) > cfg.TopKeys {
		res.Rules = res.Rules[:cfg.TopKeys]
	}
	res.TopKeys = rep.TopKeys
	res.Seconds = time.Since(began).Seconds()
	return res, nil
}

// Summary is the result in one line.
func (r Result) Summary() string {
	s := fmt.Sprintf("newly rejected: %d of %d decisions (%.2f%%) over [%s, %s): allowed then, rejected by the candidate",
		r.NewlyRejected, r.Decisions, r.Share*100, r.From.Format(time.RFC3339), r.To.Format(time.RFC3339))
	if r.NewlyAllowed > 0 {
		s += fmt.Sprintf("; %d rejected then would be allowed", r.NewlyAllowed)
	}
	return s
}

// ReplayRow is a row of decisions_raw as replay decides it again (the
// preview's and limiter policy replay's one mapping: metering and
// enforcement do not import each other).
func ReplayRow(r *rawscan.Row) replay.Row {
	return replay.Row{TS: r.TS, Key: r.Key, Scope: r.Scope, Tier: r.Tier, Cost: r.Cost,
		Allowed: r.Allowed, Source: r.Source, Policy: r.Policy, DryRun: r.DryRun, DecidedUS: r.DecidedUS,
		Kind: r.Kind, Reservation: r.Reservation, Estimate: r.Estimate, Actual: r.Actual, Priority: r.Priority}
}
