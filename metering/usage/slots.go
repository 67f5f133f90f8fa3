package usage

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/ratewarden/ratewarden/schema"
)

// GET /v1/slots: a key's concurrency slots per bucket, from slots_minute
// (docs/data.md), which the meter-consumer writes from the slot decision
// events. A point is one slot set, the key's slots in one scope (and one
// region: each region's store holds its own slots), so that its peak in
// flight is that set's, exact; counts of several points add up, peaks do
// not.

// slotsQuery reads slots_minute into buckets of a window, per scope,
// region and priority class.
type slotsQuery struct {
	db    string
	rebin string // "" (minutes), "toStartOfHour" or "toStartOfDay"
	tz    string // zone for rebin
	key   string
	scope string // "" = all scopes
	from  time.Time
	to    time.Time
	limit int // rows; the caller asks for one more than it accepts
}

func planSlots(db string, p UsageParams, key string) slotsQuery {
	q := slotsQuery{db: db, tz: p.Loc.String(), key: key, scope: p.Scope, from: p.From, to: p.To, limit: maxSlotRows + 1}
	switch p.Window {
	case Hour:
		q.rebin = "toStartOfHour"
	case Day:
		q.rebin = "toStartOfDay"
	}
	return q
}

// maxSlotRows caps the rows (bucket × scope × region × class) one answer
// reads.
const maxSlotRows = 4 * MaxPoints

func (q slotsQuery) toSQL() (string, []any) {
	var b strings.Builder
	var args []any
	b.WriteString("SELECT ")
	if q.rebin != "" {
		b.WriteString("toUInt32(" + q.rebin + "(start, ?)) AS b")
		args = append(args, q.tz)
	} else {
		b.WriteString("toUInt32(start) AS b")
	}
	// The peak of a bucket is the highest of its minutes: a maximum, never
	// a sum (the table is a plain MergeTree for that reason).
	b.WriteString(", scope, region, priority, sum(taken) AS n_taken, sum(refused) AS n_refused, sum(shed) AS n_shed," +
		" sum(released) AS n_released, max(peak_in_flight) AS n_peak")
	fmt.Fprintf(&b, " FROM %s.%s WHERE key = ?", q.db, schema.SlotsMinute)
	args = append(args, q.key)
	if q.scope != "" {
		b.WriteString(" AND scope = ?")
		args = append(args, q.scope)
	}
	// ORDER BY (key, start, ...): the key and the range are the index's.
	b.WriteString(" AND start >= toDateTime(?) AND start < toDateTime(?)")
	args = append(args, q.from.Unix(), q.to.Unix())
	fmt.Fprintf(&b, " GROUP BY b, scope, region, priority ORDER BY b, scope, region, priority LIMIT %d", q.limit)
	return b.String(), args
}

// slotRow is one row of slotsQuery.
type slotRow struct {
	start                                time.Time
	scope, region, priority              string
	taken, refused, shed, released, peak uint64
}

func (s *Store) slots(ctx context.Context, q slotsQuery) ([]slotRow, error) {
	sql, args := q.toSQL()
	rows, err := s.conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, wrap("slots query", err)
	}
	defer rows.Close()
	var out []slotRow
	for rows.Next() {
		var r slotRow
		var b uint32
		if err := rows.Scan(&b, &r.scope, &r.region, &r.priority, &r.taken, &r.refused, &r.shed, &r.released, &r.peak); err != nil {
			return nil, wrap("slots scan", err)
		}
		r.start = time.Unix(int64(b), 0).UTC()
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("slots rows", err)
	}
	return out, nil
}

// SlotCounts are the slot decisions of a bucket (or of the whole range).
type SlotCounts struct {
	// PeakInFlight is the most slots held after any slot decision: of the
	// point's slot set in a bucket; in totals, the highest of any point.
	PeakInFlight uint64 `json:"peakInFlight"`
	Taken        uint64 `json:"taken"`
	Refused      uint64 `json:"refused"` // for want of a slot (reason "concurrency")
	Shed         uint64 `json:"shed"`    // at the class's share (reason "shed")
	Released     uint64 `json:"released"`
	// ShedByPriority is Shed per priority class (absent when none was).
	ShedByPriority map[string]uint64 `json:"shedByPriority,omitempty"`
}

func (c *SlotCounts) add(r slotRow) {
	c.PeakInFlight = max(c.PeakInFlight, r.peak)
	c.Taken += r.taken
	c.Refused += r.refused
	c.Shed += r.shed
	c.Released += r.released
	if r.shed > 0 {
		if c.ShedByPriority == nil {
			c.ShedByPriority = map[string]uint64{}
		}
		c.ShedByPriority[r.priority] += r.shed
	}
}

type slotsPoint struct {
	Start  string `json:"start"`
	Scope  string `json:"scope"`
	Region string `json:"region,omitempty"` // absent: recorded without one
	SlotCounts
}

type slotsResponse struct {
	Key    string       `json:"key"`
	Window Window       `json:"window"`
	From   string       `json:"from"`
	To     string       `json:"to"`
	TZ     string       `json:"tz"`
	Source string       `json:"source"` // the table read
	Series []slotsPoint `json:"series"`
	Totals SlotCounts   `json:"totals"`
}

func (s *Server) getSlots(c *gin.Context) {
	if c.Request.URL.Query().Has("group_by") {
		fail(c, http.StatusBadRequest, "invalid_request", "group_by is not a parameter of /v1/slots: its series is always per scope and region")
		return
	}
	p, key, ok := s.seriesRequest(c)
	if !ok {
		return
	}
	q := planSlots(s.cfg.Store.db, p, key)
	ctx, cancel := s.queryCtx(c)
	defer cancel()
	rows, err := s.cfg.Store.slots(ctx, q)
	if err != nil {
		s.storeFail(c, err)
		return
	}
	if len(rows) > maxSlotRows {
		fail(c, http.StatusBadRequest, "too_many_points", fmt.Sprintf("the answer would have more than %d rows: narrow the range, widen the window or filter by scope", maxSlotRows))
		return
	}
	resp := slotsResponse{Key: key, Window: p.Window, TZ: p.Loc.String(), Source: schema.SlotsMinute,
		From: p.From.In(p.Loc).Format(time.RFC3339), To: p.To.In(p.Loc).Format(time.RFC3339), Series: []slotsPoint{}}
	type point struct {
		start         int64
		scope, region string
	}
	index := map[point]int{}
	for _, r := range rows { // in bucket order (ORDER BY b)
		k := point{r.start.Unix(), r.scope, r.region}
		i, ok := index[k]
		if !ok {
			i = len(resp.Series)
			index[k] = i
			resp.Series = append(resp.Series, slotsPoint{Start: r.start.In(p.Loc).Format(time.RFC3339), Scope: r.scope, Region: r.region})
		}
		resp.Series[i].add(r)
		resp.Totals.add(r)
	}
	c.JSON(http.StatusOK, resp)
}
