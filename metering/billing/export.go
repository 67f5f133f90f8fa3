package billing

import (
	"context"
	"crypto/sha256"
	"encoding/csv"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// ExportRow is one exported line of a final statement, or (for a billing
// system's meter) one measure of its totals, with its identifier: the
// same row of the same statement has the same identifier in every export,
// so a billing system that deduplicates by it (Stripe's meter event
// identifier) never bills a resend twice, and the export's record says
// which rows went where.
type ExportRow struct {
	Identifier string `json:"identifier"`
	Key        string `json:"key"`
	Period     string `json:"period"`
	TZ         string `json:"tz"`
	Line       string `json:"line"`            // meter | correction | adjustment | total | hourly
	Scope      string `json:"scope,omitempty"` // a meter's or a correction's scope
	Unit       string `json:"unit,omitempty"`
	Ref        string `json:"ref,omitempty"`     // a correction's id, an adjustment's period, an hourly row's hour (RFC 3339)
	Measure    string `json:"measure,omitempty"` // a total's: requests | cost
	Requests   int64  `json:"requests"`
	Cost       int64  `json:"cost"`
}

// Lines of a billing system's rows (ExportRow.Line): a final period's
// totals (less what its hourly rows sent), and the open period's hourly
// increments.
const (
	LineTotal  = "total"
	LineHourly = "hourly"
)

// Measures of a total or hourly row (ExportRow.Measure).
const (
	MeasureRequests = "requests"
	MeasureCost     = "cost"
)

// Value is a total row's value: its measure's.
func (r ExportRow) Value() int64 {
	if r.Measure == MeasureCost {
		return r.Cost
	}
	return r.Requests
}

// identifier is a row's identity, hashed to a fixed 35 characters
// (Stripe allows 100).
func identifier(parts ...string) string {
	h := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return "rw_" + hex.EncodeToString(h[:16])
}

// LineRows are a final statement's lines as rows (files: every line).
func LineRows(s Statement) []ExportRow {
	var out []ExportRow
	row := func(line, scope, unit, ref string, req, cost int64) {
		out = append(out, ExportRow{Identifier: identifier(s.Key, s.TZ, s.Period, line, scope, ref), Key: s.Key, Period: s.Period, TZ: s.TZ,
			Line: line, Scope: scope, Unit: unit, Ref: ref, Requests: req, Cost: cost})
	}
	for _, m := range s.Meters {
		row(LineMeter, m.Scope, m.Unit, "", m.Requests, m.Cost)
	}
	for _, c := range s.Corrections {
		row(LineCorrection, c.Scope, "", c.ID, c.Requests, c.Cost)
	}
	for _, a := range s.Adjustments {
		row(LineAdjustment, "", "", a.Period, a.Requests, a.Cost)
	}
	return out
}

// TotalRows are a final statement's totals as one row per measure (a
// billing system's meters: requests and cost), net of its corrections and
// adjustments.
func TotalRows(s Statement) []ExportRow {
	var out []ExportRow
	for _, m := range []string{MeasureRequests, MeasureCost} {
		out = append(out, ExportRow{Identifier: identifier(s.Key, s.TZ, s.Period, LineTotal, m), Key: s.Key, Period: s.Period, TZ: s.TZ,
			Line: LineTotal, Measure: m, Requests: s.Totals.Requests, Cost: s.Totals.Cost})
	}
	return out
}

// ExportStore lists the keys of a period and keeps the export's record.
type ExportStore interface {
	// Keys are the keys with any usage recorded in [from, to) (perhaps a
	// few more, never fewer).
	Keys(ctx context.Context, from, to time.Time) ([]string, error)
	// Exported are the identifiers recorded as exported to destination.
	Exported(ctx context.Context, destination, period string) (map[string]bool, error)
	// RecordExport records rows as exported to destination at at.
	RecordExport(ctx context.Context, destination string, rows []ExportRow, at time.Time) error
	// Plans are the rows planned for destination in period, the first
	// planned of each identifier, in the order they were planned.
	Plans(ctx context.Context, destination, period string) ([]ExportRow, error)
	// Plan records rows as about to be sent to destination, at at.
	Plan(ctx context.Context, destination string, rows []ExportRow, at time.Time) error
}

// Sender delivers rows to a billing system, each row at most once per
// identifier on its side (Stripe's meter events dedupe by identifier).
type Sender interface {
	Send(ctx context.Context, rows []ExportRow) error
}

// Exporter exports final periods. Safe for concurrent use.
type Exporter struct {
	Statements *Statements
	Store      ExportStore
	// Chunk is how many rows are sent before they are recorded; 0 = 20.
	// A crash between a send and its record sends at most a chunk again,
	// under the same identifiers.
	Chunk int
}

// Statements are the final statements of p for keys (every key with usage
// in p when keys is empty), freezing those not frozen yet; a statement
// without any line is left out. p must be final.
func (x *Exporter) statements(ctx context.Context, p Period, keys []string) ([]Statement, error) {
	if st := p.State(x.Statements.now(), x.Statements.grace()); st != StateFinal {
		return nil, fmt.Errorf("%w: %s (%s) is %s: only a final period is exported", ErrInvalid, p, p.TZ(), st)
	}
	if len(keys) == 0 {
		start, end := p.Bounds()
		var err error
		if keys, err = x.Store.Keys(ctx, start, end); err != nil {
			return nil, err
		}
	}
	var out []Statement
	for _, k := range keys {
		s, err := x.Statements.Get(ctx, k, p, false)
		if err != nil {
			return nil, err
		}
		if len(s.Meters)+len(s.Corrections)+len(s.Adjustments) > 0 {
			out = append(out, s)
		}
	}
	return out, nil
}

// Rows are the rows of p's final statements of keys: every line
// (LineRows), or the totals (TotalRows).
func (x *Exporter) Rows(ctx context.Context, p Period, keys []string, totals bool) ([]ExportRow, error) {
	sts, err := x.statements(ctx, p, keys)
	if err != nil {
		return nil, err
	}
	var rows []ExportRow
	for _, s := range sts {
		if totals {
			rows = append(rows, TotalRows(s)...)
		} else {
			rows = append(rows, LineRows(s)...)
		}
	}
	return rows, nil
}

// Send delivers p's totals of keys (p final) to destination through
// snd, less what the hourly rows of the open period (SendOpen) planned
// for each key and measure, so that a key is billed its final totals
// exactly: its hourly rows plus this remainder. Rows its record holds
// already are skipped: an export that stopped (killed, a network error)
// resumes where it stopped when run again, planned rows first. Rows whose
// value is negative (credits, or voids after hourly rows were sent, above
// the usage) are not sent and are returned in refused. sent counts the
// rows sent by this run.
func (x *Exporter) Send(ctx context.Context, p Period, keys []string, destination string, snd Sender) (sent int, refused []ExportRow, err error) {
	sts, err := x.statements(ctx, p, keys)
	if err != nil {
		return 0, nil, err
	}
	plans, err := x.Store.Plans(ctx, destination, p.String())
	if err != nil {
		return 0, nil, err
	}
	hourly := map[[2]string]int64{}
	for _, r := range plans {
		if r.Line == LineHourly {
			hourly[[2]string{r.Key, r.Measure}] += r.Value()
		}
	}
	var todo []ExportRow
	for _, s := range sts {
		for _, r := range TotalRows(s) {
			if h := hourly[[2]string{r.Key, r.Measure}]; h != 0 {
				r.setValue(r.Value() - h)
			}
			if r.Value() < 0 {
				refused = append(refused, r)
				continue
			}
			todo = append(todo, r)
		}
	}
	sent, err = x.deliver(ctx, p, destination, plans, todo, snd)
	return sent, refused, err
}

// SendOpen delivers the open period p's usage of keys (every key with
// usage in p when keys is empty) to destination through snd as hourly
// rows: for each key and measure with usage since the rows planned
// before, one row per hour (the hour is in its identifier), valued at the
// statement's totals now less every hourly row planned before. Run it
// every hour (more often sends nothing new within an hour); once p is
// final, Send bills the rest. Each row is planned (its value fixed)
// before it is sent, so a run that stops resumes with the same rows.
func (x *Exporter) SendOpen(ctx context.Context, p Period, keys []string, destination string, snd Sender) (sent int, err error) {
	now := x.Statements.now()
	if st := p.State(now, x.Statements.grace()); st != StateOpen {
		return 0, fmt.Errorf("%w: %s (%s) is %s: only the open period is exported hourly (a closed one whole, once final)", ErrInvalid, p, p.TZ(), st)
	}
	start, end := p.Bounds()
	if len(keys) == 0 {
		if keys, err = x.Store.Keys(ctx, start, end); err != nil {
			return 0, err
		}
	}
	plans, err := x.Store.Plans(ctx, destination, p.String())
	if err != nil {
		return 0, err
	}
	planned := map[string]bool{}
	sums := map[[2]string]int64{}
	for _, r := range plans {
		planned[r.Identifier] = true
		if r.Line == LineHourly {
			sums[[2]string{r.Key, r.Measure}] += r.Value()
		}
	}
	hour := now.UTC().Truncate(time.Hour)
	if hour.Before(start) {
		hour = start.UTC()
	}
	ref := hour.Format(time.RFC3339)
	var todo []ExportRow
	for _, k := range keys {
		s, err := x.Statements.Get(ctx, k, p, false)
		if err != nil {
			return 0, err
		}
		for _, m := range []string{MeasureRequests, MeasureCost} {
			r := ExportRow{Identifier: identifier(k, p.TZ(), p.String(), LineHourly, m, ref), Key: k, Period: p.String(), TZ: p.TZ(),
				Line: LineHourly, Ref: ref, Measure: m}
			total := s.Totals.Requests
			if m == MeasureCost {
				total = s.Totals.Cost
			}
			// Only an increase is sent: a decrease (a void, a credit)
			// is netted by the next hours' usage or by the final row.
			if v := total - sums[[2]string{k, m}]; v > 0 && !planned[r.Identifier] {
				r.setValue(v)
				todo = append(todo, r)
			}
		}
	}
	return x.deliver(ctx, p, destination, plans, todo, snd)
}

// setValue sets the value of a row's measure, and the other to 0.
func (r *ExportRow) setValue(v int64) {
	r.Requests, r.Cost = 0, 0
	if r.Measure == MeasureCost {
		r.Cost = v
	} else {
		r.Requests = v
	}
}

// deliver plans todo (rows not planned before), then sends every planned
// row of p its record does not hold, in the order planned, chunk by
// chunk, recording each chunk once it is sent. A crash between a send
// and its record sends that chunk again under the same identifiers and
// values.
func (x *Exporter) deliver(ctx context.Context, p Period, destination string, plans, todo []ExportRow, snd Sender) (sent int, err error) {
	planned := map[string]bool{}
	for _, r := range plans {
		planned[r.Identifier] = true
	}
	var fresh []ExportRow
	for _, r := range todo {
		if !planned[r.Identifier] {
			fresh = append(fresh, r)
		}
	}
	if len(fresh) > 0 {
		if err := x.Store.Plan(ctx, destination, fresh, x.Statements.now()); err != nil {
			return 0, err
		}
		// Read back: if two exports planned at once, the first planned
		// row of each identifier is the one both send.
		if plans, err = x.Store.Plans(ctx, destination, p.String()); err != nil {
			return 0, err
		}
	}
	done, err := x.Store.Exported(ctx, destination, p.String())
	if err != nil {
		return 0, err
	}
	var pending []ExportRow
	for _, r := range plans {
		if !done[r.Identifier] {
			pending = append(pending, r)
		}
	}
	chunk := x.Chunk
	if chunk <= 0 {
		chunk = 20
	}
	for len(pending) > 0 {
		n := min(chunk, len(pending))
		if err := snd.Send(ctx, pending[:n]); err != nil {
			return sent, err
		}
		if err := x.Store.RecordExport(ctx, destination, pending[:n], x.Statements.now()); err != nil {
			return sent, err
		}
		sent += n
		pending = pending[n:]
	}
	return sent, nil
}

// Formats of an export file.
const (
	FormatCSV  = "csv"
	FormatJSON = "json"
)

// WriteRows writes rows as CSV (a header line, then one line per row) or
// as a JSON array.
func WriteRows(w io.Writer, format string, rows []ExportRow) error {
	switch format {
	case FormatJSON:
		if rows == nil {
			rows = []ExportRow{}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	case FormatCSV:
		cw := csv.NewWriter(w)
		_ = cw.Write([]string{"identifier", "key", "period", "tz", "line", "scope", "unit", "ref", "requests", "cost"})
		for _, r := range rows {
			_ = cw.Write([]string{r.Identifier, r.Key, r.Period, r.TZ, r.Line, r.Scope, r.Unit, r.Ref,
				strconv.FormatInt(r.Requests, 10), strconv.FormatInt(r.Cost, 10)})
		}
		cw.Flush()
		return cw.Error()
	}
	return fmt.Errorf("%w: format %q (csv or json)", ErrInvalid, format)
}
