package usage

import (
	"fmt"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/ratewarden/ratewarden/limits"
)

// Window is the width of one bucket of a usage series.
type Window string

// The windows of GET /v1/usage.
const (
	Minute Window = "minute"
	Hour   Window = "hour"
	Day    Window = "day"
)

// Limits on one usage request. They bound the work ClickHouse does for one
// call and the size of a response.
const (
	// MaxPoints caps the rows (buckets × scopes) of one response.
	MaxPoints = 5000
	// MaxKeyLen and MaxScopeLen mirror the limits of POST /check.
	MaxKeyLen   = limits.MaxKeyBytes
	MaxScopeLen = limits.MaxScopeBytes
	// MaxTopKeys caps limit= of GET /v1/admin/top-keys.
	MaxTopKeys = 1000
)

// MaxRange is the longest from..to span accepted for window w (0 for a
// window that is not Minute, Hour or Day).
func MaxRange(w Window) time.Duration {
	switch w {
	case Minute:
		return 48 * time.Hour
	case Hour:
		return 93 * 24 * time.Hour
	case Day:
		return 3700 * 24 * time.Hour
	}
	return 0
}

// defaultSpan is the range used when from is absent.
var defaultSpan = map[Window]time.Duration{
	Minute: time.Hour,
	Hour:   24 * time.Hour,
	Day:    30 * 24 * time.Hour,
}

// ParamError is a bad request parameter: it becomes a 400 whose message is
// Error(). Problems lists every problem found, so one round trip shows all.
type ParamError struct {
	Problems []string
}

func (e *ParamError) Error() string { return strings.Join(e.Problems, "; ") }

type problems []string

func (p *problems) add(format string, args ...any) { *p = append(*p, fmt.Sprintf(format, args...)) }

func (p problems) err() error {
	if len(p) == 0 {
		return nil
	}
	return &ParamError{Problems: p}
}

// UsageParams is a validated GET /v1/usage request. From and To are aligned
// to bucket boundaries of Window in Loc (From down, To up), so every bucket
// in the answer is whole.
type UsageParams struct {
	Key          string // empty until the caller's identity decides it (portal tokens)
	From, To     time.Time
	Window       Window
	Scope        string // empty: every scope
	GroupByScope bool
	// GroupByRegion: one series per region of the deciding limiters
	// (group_by=region); without it a key's usage is summed over regions.
	GroupByRegion bool
	Loc           *time.Location
}

var usageParamNames = map[string]bool{"key": true, "from": true, "to": true, "window": true, "scope": true, "group_by": true, "tz": true}

// ParseUsageParams validates the query of GET /v1/usage at now. Absent
// window means hour, absent to means now, absent from means a window-sized
// default span (1 h, 24 h, 30 d) before to, absent tz means UTC.
func ParseUsageParams(q url.Values, now time.Time) (UsageParams, error) {
	var p problems
	single := singles(q, usageParamNames, &p)

	out := UsageParams{Window: Hour, Loc: time.UTC}
	if w, ok := single["window"]; ok {
		switch Window(w) {
		case Minute, Hour, Day:
			out.Window = Window(w)
		default:
			p.add("window must be one of minute, hour, day")
		}
	}
	if k, ok := single["key"]; ok {
		if msg := checkText(k, MaxKeyLen); msg != "" {
			p.add("key %s", msg)
		}
		out.Key = k
	}
	if s, ok := single["scope"]; ok {
		if msg := checkText(s, MaxScopeLen); msg != "" {
			p.add("scope %s", msg)
		}
		out.Scope = s
	}
	if g, ok := single["group_by"]; ok && g != "" {
		// A comma-separated list: scope, region, or both.
		bad := false
		for _, part := range strings.Split(g, ",") {
			switch part {
			case "scope":
				bad = bad || out.GroupByScope
				out.GroupByScope = true
			case "region":
				bad = bad || out.GroupByRegion
				out.GroupByRegion = true
			default:
				bad = true
			}
		}
		if bad {
			p.add("group_by must be scope, region or scope,region (or absent)")
			out.GroupByScope, out.GroupByRegion = false, false
		}
	}
	if tz, ok := single["tz"]; ok && tz != "" {
		loc, err := parseZone(tz)
		if err != nil {
			p.add("%v", err)
		} else {
			out.Loc = loc
		}
	}
	from, to, ok := parseRange(single, now, defaultSpan[out.Window], &p)
	if ok {
		out.From = bucketFloor(from, out.Window, out.Loc)
		out.To = bucketCeil(to, out.Window, out.Loc)
		if max := MaxRange(out.Window); out.To.Sub(out.From) > max {
			p.add("range too long for window=%s: at most %s (ask for a wider window)", out.Window, human(max))
		}
	}
	return out, p.err()
}

// TopKeysParams is a validated GET /v1/admin/top-keys request.
type TopKeysParams struct {
	From, To time.Time
	Limit    int
}

var topKeysParamNames = map[string]bool{"from": true, "to": true, "limit": true}

// MaxTopKeysRange is the longest from..to span of GET /v1/admin/top-keys.
const MaxTopKeysRange = 400 * 24 * time.Hour

// ParseTopKeysParams validates the query of GET /v1/admin/top-keys at now.
// Defaults: the last 24 hours, limit 10. From and To are rounded outwards to
// whole minutes.
func ParseTopKeysParams(q url.Values, now time.Time) (TopKeysParams, error) {
	var p problems
	single := singles(q, topKeysParamNames, &p)
	out := TopKeysParams{Limit: 10}
	if l, ok := single["limit"]; ok {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > MaxTopKeys {
			p.add("limit must be an integer from 1 to %d", MaxTopKeys)
		} else {
			out.Limit = n
		}
	}
	from, to, ok := parseRange(single, now, 24*time.Hour, &p)
	if ok {
		out.From = bucketFloor(from, Minute, time.UTC)
		out.To = bucketCeil(to, Minute, time.UTC)
		if out.To.Sub(out.From) > MaxTopKeysRange {
			p.add("range too long: at most %s", human(MaxTopKeysRange))
		}
	}
	return out, p.err()
}

// singles returns each parameter's only value, adding a problem for unknown
// and repeated parameters.
func singles(q url.Values, known map[string]bool, p *problems) map[string]string {
	names := make([]string, 0, len(q))
	for n := range q {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make(map[string]string, len(q))
	for _, n := range names {
		vs := q[n]
		if !known[n] {
			p.add("unknown parameter %s", strconv.Quote(clip(n, 40)))
			continue
		}
		if len(vs) != 1 {
			p.add("%s must be given once", n)
			continue
		}
		out[n] = vs[0]
	}
	return out
}

func parseRange(single map[string]string, now time.Time, span time.Duration, p *problems) (from, to time.Time, ok bool) {
	ok = true
	to = now
	if s, has := single["to"]; has {
		t, err := time.Parse(time.RFC3339, s)
		if err != nil {
			p.add("to must be an RFC 3339 time such as 2026-07-31T09:15:00Z")
			ok = false
		}
		to = t
	}
	from = to.Add(-span)
	if s, has := single["from"]; has {
		t, err := time.Parse(time.RFC3339, s)
		if err != nil {
			p.add("from must be an RFC 3339 time such as 2026-07-01T00:00:00Z")
			ok = false
		}
		from = t
	}
	if !ok {
		return from, to, false
	}
	if from.Year() < 1971 || to.Year() > 2105 {
		p.add("from and to must lie between 1971 and 2105")
		return from, to, false
	}
	if !from.Before(to) {
		p.add("from must be before to")
		return from, to, false
	}
	return from, to, true
}

var zoneName = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_+\-]*(/[A-Za-z0-9_+\-]+){0,2}$`)

// parseZone accepts an IANA zone name such as Europe/Paris or UTC.
func parseZone(tz string) (*time.Location, error) {
	if len(tz) > 64 || !zoneName.MatchString(tz) || tz == "Local" {
		return nil, fmt.Errorf("tz must be an IANA time zone name such as Europe/Paris")
	}
	loc, err := time.LoadLocation(tz)
	if err != nil {
		return nil, fmt.Errorf("tz %s is not a known IANA time zone", strconv.Quote(tz))
	}
	return loc, nil
}

// checkText returns why s is not an acceptable key or scope, or "".
func checkText(s string, max int) string {
	switch {
	case s == "":
		return "must not be empty"
	case len(s) > max:
		return fmt.Sprintf("must be at most %d bytes", max)
	case !utf8.ValidString(s):
		return "must be valid UTF-8"
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return "must not contain control characters"
		}
	}
	return ""
}

// bucketFloor is the start of the window-wide bucket, in loc, that holds t.
func bucketFloor(t time.Time, w Window, loc *time.Location) time.Time {
	lt := t.In(loc)
	switch w {
	case Minute:
		return t.Truncate(time.Minute).UTC()
	case Hour:
		// Subtract the local minutes and seconds: right in zones whose offset
		// is not a whole number of hours, and across DST changes.
		return lt.Add(-time.Duration(lt.Minute())*time.Minute - time.Duration(lt.Second())*time.Second - time.Duration(lt.Nanosecond())).UTC()
	default:
		return time.Date(lt.Year(), lt.Month(), lt.Day(), 0, 0, 0, 0, loc).UTC()
	}
}

// bucketCeil is t when it starts a bucket, else the start of the next one.
func bucketCeil(t time.Time, w Window, loc *time.Location) time.Time {
	f := bucketFloor(t, w, loc)
	if f.Equal(t) {
		return f
	}
	switch w {
	case Minute:
		return f.Add(time.Minute)
	case Hour:
		return bucketFloor(f.Add(90*time.Minute), Hour, loc)
	default:
		lf := f.In(loc)
		return time.Date(lf.Year(), lf.Month(), lf.Day()+1, 0, 0, 0, 0, loc).UTC()
	}
}

// zoneOffsets reports whether every UTC offset loc uses in [from, to) is zero,
// and whether every one is a whole number of hours.
func zoneOffsets(loc *time.Location, from, to time.Time) (allZero, wholeHours bool) {
	allZero, wholeHours = true, true
	t := from
	for i := 0; i < 10000; i++ {
		_, off := t.In(loc).Zone()
		if off != 0 {
			allZero = false
		}
		if off%3600 != 0 {
			wholeHours = false
		}
		_, end := t.In(loc).ZoneBounds()
		if end.IsZero() || !end.Before(to) {
			break
		}
		t = end
	}
	return allZero, wholeHours
}

func human(d time.Duration) string {
	if d%(24*time.Hour) == 0 {
		return fmt.Sprintf("%d days", d/(24*time.Hour))
	}
	return d.String()
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
