package billing

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// CorrectionTierPrefix starts the tier of a correction's events and rollup
// rows: "correction:<id>". The rollups keep a correction's rows apart from
// the usage it corrects (tier is in their sort key), so a statement reads
// each correction's effect per scope from the same exact tables, and the
// usage API, which sums over tiers, shows usage net of corrections.
const CorrectionTierPrefix = "correction:"

// CorrectionOf is the correction id of a rollup tier, ok false for a tier
// of usage.
func CorrectionOf(tier string) (id string, ok bool) {
	return strings.CutPrefix(tier, CorrectionTierPrefix)
}

// Row is one (scope, tier) sum of a key's usage over a range: Requests and
// Cost are signed, since a correction's rows subtract.
type Row struct {
	Scope, Tier    string
	Requests, Cost int64
}

// Line kinds of a statement (Line.Kind).
const (
	LineMeter      = "meter"      // the period's usage of one scope
	LineCorrection = "correction" // one correction's effect on one scope in the period
	LineAdjustment = "adjustment" // what a final period gained after it was frozen
)

// Line is one line of a statement, as frozen: a meter (Scope, Unit), a
// correction (Ref = its id, Scope) or an adjustment (Ref = the period it
// belongs to).
type Line struct {
	Kind, Scope, Unit, Ref string
	Requests, Cost         int64
}

// Snapshot is a frozen statement's lines and when it was frozen.
type Snapshot struct {
	Period      string
	Lines       []Line
	FinalizedAt time.Time
}

// Totals are summed requests and cost units.
type Totals struct {
	Requests int64 `json:"requests"`
	Cost     int64 `json:"cost"`
}

func (t *Totals) add(r, c int64) { t.Requests += r; t.Cost += c }

// Meter is a statement's usage of one scope. Requests counts decisions,
// allowed or rejected (as the usage API does); Cost the cost units of the
// allowed ones, settled reservations at their actual cost.
type Meter struct {
	Scope    string `json:"scope"`
	Unit     string `json:"unit"`
	Requests int64  `json:"requests"`
	Cost     int64  `json:"cost"`
}

// CorrectionLine is one correction's effect on one scope of the period
// (negative for a void or a credit), with what the audit record says of it.
type CorrectionLine struct {
	ID       string `json:"id"`
	Scope    string `json:"scope"`
	Requests int64  `json:"requests"`
	Cost     int64  `json:"cost"`
	Kind     string `json:"kind,omitempty"`
	Reason   string `json:"reason,omitempty"`
	Operator string `json:"operator,omitempty"`
}

// Adjustment is what a final period gained after it was frozen (late
// events, corrections of its range), billed here instead.
type Adjustment struct {
	Period   string `json:"period"`
	Requests int64  `json:"requests"`
	Cost     int64  `json:"cost"`
}

// Statement is a key's usage for a period. Totals is the sum of every
// line: meters, corrections and adjustments.
type Statement struct {
	Key         string           `json:"key"`
	Period      string           `json:"period"`
	TZ          string           `json:"tz"`
	From        string           `json:"from"`
	To          string           `json:"to"`
	State       string           `json:"state"`
	FinalizedAt string           `json:"finalizedAt,omitempty"`
	Meters      []Meter          `json:"meters"`
	Corrections []CorrectionLine `json:"corrections"`
	Adjustments []Adjustment     `json:"adjustments"`
	Totals      Totals           `json:"totals"`
	// With verify: whether the rollups of the period agree with the raw
	// record (and the corrections with their audit records), and both.
	Verified *bool   `json:"verified,omitempty"`
	Raw      *Totals `json:"raw,omitempty"`
	Rollups  *Totals `json:"rollups,omitempty"`
}

// Store is what statements read and write (billing/chstore over ClickHouse).
type Store interface {
	// Usage sums the rollups of key over [from, to) (whole minutes) by
	// scope and tier.
	Usage(ctx context.Context, key string, from, to time.Time) ([]Row, error)
	// Raw sums the raw record of key's events counted in [from, to) by
	// scope, corrections left out (they are checked against their audit
	// records).
	Raw(ctx context.Context, key string, from, to time.Time) ([]Row, error)
	// Snapshots are the frozen statements of key in zone tz, the first
	// written of each period.
	Snapshots(ctx context.Context, key, tz string) ([]Snapshot, error)
	// WriteSnapshot freezes a period's lines.
	WriteSnapshot(ctx context.Context, key, tz string, s Snapshot) error
	// Corrections are the audit records of key's corrections.
	Corrections(ctx context.Context, key string) ([]Correction, error)
}

// Statements computes statements. Safe for concurrent use once built.
type Statements struct {
	Store Store
	// Grace is how long after its end a period still takes late events;
	// 0 = DefaultGrace.
	Grace time.Duration
	// Units names the cost unit of a key's scope ("tokens"); nil or "" =
	// none.
	Units func(key, scope string) string
	// Now is the clock; nil = time.Now.
	Now func() time.Time
}

// AdjustWindow is how many months around a period the statement looks for
// final periods that gained something after they were frozen: keep the
// rollups at least this long (docs/billing.md, "Late events after a
// period is final").
const AdjustWindow = 12

func (s *Statements) grace() time.Duration {
	if s.Grace == 0 {
		return DefaultGrace
	}
	return s.Grace
}

func (s *Statements) now() time.Time {
	if s.Now == nil {
		return time.Now()
	}
	return s.Now()
}

// Get is key's statement for p. A final period is frozen by the first Get
// (or Finalize) after its grace; verify adds the check against the raw
// record.
func (s *Statements) Get(ctx context.Context, key string, p Period, verify bool) (Statement, error) {
	state := p.State(s.now(), s.grace())
	snaps, err := s.Store.Snapshots(ctx, key, p.TZ())
	if err != nil {
		return Statement{}, err
	}
	snap, frozen := findSnapshot(snaps, p.String())
	if state == StateFinal && !frozen {
		if snap, err = s.freeze(ctx, key, p, snaps); err != nil {
			return Statement{}, err
		}
		frozen = true
	}
	var lines []Line
	if frozen {
		lines = snap.Lines
	} else if lines, err = s.lines(ctx, key, p, snaps); err != nil {
		return Statement{}, err
	}
	audits, err := s.Store.Corrections(ctx, key)
	if err != nil {
		return Statement{}, err
	}
	st := compose(key, p, state, lines, audits)
	if frozen {
		st.FinalizedAt = snap.FinalizedAt.UTC().Format(time.RFC3339)
	}
	if verify {
		if err := s.verify(ctx, key, p, audits, &st); err != nil {
			return Statement{}, err
		}
	}
	return st, nil
}

// Finalize freezes p's statement of key if its grace is over and it is not
// frozen yet, and returns the frozen lines; ok is false while p is open or
// closing.
func (s *Statements) Finalize(ctx context.Context, key string, p Period) (snap Snapshot, ok bool, err error) {
	if p.State(s.now(), s.grace()) != StateFinal {
		return Snapshot{}, false, nil
	}
	snaps, err := s.Store.Snapshots(ctx, key, p.TZ())
	if err != nil {
		return Snapshot{}, false, err
	}
	if snap, ok := findSnapshot(snaps, p.String()); ok {
		return snap, true, nil
	}
	snap, err = s.freeze(ctx, key, p, snaps)
	return snap, err == nil, err
}

// freeze writes p's lines as they are now and returns the snapshot that
// wins: if two replicas froze the period at once, the first written, so
// that every answer after this one is the same.
func (s *Statements) freeze(ctx context.Context, key string, p Period, snaps []Snapshot) (Snapshot, error) {
	lines, err := s.lines(ctx, key, p, snaps)
	if err != nil {
		return Snapshot{}, err
	}
	if err := s.Store.WriteSnapshot(ctx, key, p.TZ(), Snapshot{Period: p.String(), Lines: lines, FinalizedAt: s.now()}); err != nil {
		return Snapshot{}, err
	}
	again, err := s.Store.Snapshots(ctx, key, p.TZ())
	if err != nil {
		return Snapshot{}, err
	}
	snap, ok := findSnapshot(again, p.String())
	if !ok {
		return Snapshot{}, fmt.Errorf("billing: the snapshot of %s %s written is not read back", key, p)
	}
	return snap, nil
}

func findSnapshot(snaps []Snapshot, period string) (Snapshot, bool) {
	for _, s := range snaps {
		if s.Period == period {
			return s, true
		}
	}
	return Snapshot{}, false
}

// lines are p's lines from the rollups as they are now: its meters and
// corrections, and an adjustment for every final period near it whose
// record differs from what was billed for it (late events, later
// corrections).
//
// The adjustments bill every difference once, whatever order periods are
// frozen in: what was billed for a final period Q is its own frozen lines
// (meters and corrections) plus every adjustment any frozen statement
// carries for Q, so Q's adjustment now is live(Q) minus that. Once p is
// frozen, the statements billed for every period equal its record then.
func (s *Statements) lines(ctx context.Context, key string, p Period, snaps []Snapshot) ([]Line, error) {
	start, end := p.Bounds()
	rows, err := s.Store.Usage(ctx, key, start, end)
	if err != nil {
		return nil, err
	}
	lines := s.usageLines(key, rows)
	billed := map[string]Totals{}
	for _, snap := range snaps {
		for _, l := range snap.Lines {
			ref := snap.Period
			if l.Kind == LineAdjustment {
				ref = l.Ref
			}
			t := billed[ref]
			t.add(l.Requests, l.Cost)
			billed[ref] = t
		}
	}
	lo, hi := p.Add(-AdjustWindow).String(), p.Add(AdjustWindow).String()
	for _, snap := range snaps {
		if snap.Period == p.String() || snap.Period < lo || snap.Period > hi {
			continue
		}
		q, err := ParsePeriod(snap.Period, p.TZ())
		if err != nil {
			return nil, err
		}
		qs, qe := q.Bounds()
		live, err := s.Store.Usage(ctx, key, qs, qe)
		if err != nil {
			return nil, err
		}
		d := billed[snap.Period]
		d.Requests, d.Cost = -d.Requests, -d.Cost
		for _, r := range live {
			d.add(r.Requests, r.Cost)
		}
		if d != (Totals{}) {
			lines = append(lines, Line{Kind: LineAdjustment, Ref: snap.Period, Requests: d.Requests, Cost: d.Cost})
		}
	}
	return lines, nil
}

// usageLines are the meter and correction lines of rollup rows, in a
// stable order (scope; correction id, scope).
func (s *Statements) usageLines(key string, rows []Row) []Line {
	meters := map[string]*Line{}
	corr := map[[2]string]*Line{}
	for _, r := range rows {
		if id, ok := CorrectionOf(r.Tier); ok {
			k := [2]string{id, r.Scope}
			if corr[k] == nil {
				corr[k] = &Line{Kind: LineCorrection, Ref: id, Scope: r.Scope}
			}
			corr[k].Requests += r.Requests
			corr[k].Cost += r.Cost
			continue
		}
		if meters[r.Scope] == nil {
			unit := ""
			if s.Units != nil {
				unit = s.Units(key, r.Scope)
			}
			meters[r.Scope] = &Line{Kind: LineMeter, Scope: r.Scope, Unit: unit}
		}
		meters[r.Scope].Requests += r.Requests
		meters[r.Scope].Cost += r.Cost
	}
	var out []Line
	for _, l := range meters {
		if l.Requests != 0 || l.Cost != 0 {
			out = append(out, *l)
		}
	}
	for _, l := range corr {
		if l.Requests != 0 || l.Cost != 0 {
			out = append(out, *l)
		}
	}
	slices.SortFunc(out, func(a, b Line) int {
		return strings.Compare(a.Kind+"\x00"+a.Ref+"\x00"+a.Scope, b.Kind+"\x00"+b.Ref+"\x00"+b.Scope)
	})
	return out
}

// compose builds the statement of lines; audits give the corrections'
// reasons and operators.
func compose(key string, p Period, state string, lines []Line, audits []Correction) Statement {
	start, end := p.Bounds()
	st := Statement{Key: key, Period: p.String(), TZ: p.TZ(), State: state,
		From: start.Format(time.RFC3339), To: end.Format(time.RFC3339),
		Meters: []Meter{}, Corrections: []CorrectionLine{}, Adjustments: []Adjustment{}}
	byID := map[string]Correction{}
	for _, a := range audits {
		byID[a.ID] = a
	}
	for _, l := range lines {
		st.Totals.add(l.Requests, l.Cost)
		switch l.Kind {
		case LineMeter:
			st.Meters = append(st.Meters, Meter{Scope: l.Scope, Unit: l.Unit, Requests: l.Requests, Cost: l.Cost})
		case LineCorrection:
			a := byID[l.Ref]
			st.Corrections = append(st.Corrections, CorrectionLine{ID: l.Ref, Scope: l.Scope, Requests: l.Requests, Cost: l.Cost,
				Kind: a.Kind, Reason: a.Reason, Operator: a.Operator})
		case LineAdjustment:
			st.Adjustments = append(st.Adjustments, Adjustment{Period: l.Ref, Requests: l.Requests, Cost: l.Cost})
		}
	}
	return st
}

// verify recomputes p from the raw record: its usage from the raw events,
// its corrections from their audit records, against the rollups as they
// are now (for a final period, the frozen lines may differ from both by
// what arrived later: that difference is the next statement's adjustment).
func (s *Statements) verify(ctx context.Context, key string, p Period, audits []Correction, st *Statement) error {
	start, end := p.Bounds()
	live, err := s.Store.Usage(ctx, key, start, end)
	if err != nil {
		return err
	}
	raw, err := s.Store.Raw(ctx, key, start, end)
	if err != nil {
		return err
	}
	var rollups, record Totals
	perScope := map[string]Totals{}
	for _, r := range live {
		rollups.add(r.Requests, r.Cost)
		scope := r.Scope
		if id, ok := CorrectionOf(r.Tier); ok {
			scope = CorrectionTierPrefix + id + "\x00" + scope
		}
		t := perScope[scope]
		t.add(r.Requests, r.Cost)
		perScope[scope] = t
	}
	for _, r := range raw {
		record.add(r.Requests, r.Cost)
		t := perScope[r.Scope]
		t.add(-r.Requests, -r.Cost)
		perScope[r.Scope] = t
	}
	for _, a := range audits {
		for _, pc := range a.Pieces {
			if !p.Contains(time.UnixMilli(pc.TS)) {
				continue
			}
			record.add(pc.Requests, pc.Cost)
			k := CorrectionTierPrefix + a.ID + "\x00" + pc.Scope
			t := perScope[k]
			t.add(-pc.Requests, -pc.Cost)
			perScope[k] = t
		}
	}
	ok := true
	for _, t := range perScope {
		if t != (Totals{}) {
			ok = false
		}
	}
	st.Verified, st.Raw, st.Rollups = &ok, &record, &rollups
	return nil
}
