package usage

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"
)

func TestParseUsageParams(t *testing.T) {
	now := time.Date(2026, 7, 31, 9, 15, 30, 0, time.UTC)
	paris, _ := time.LoadLocation("Europe/Paris")
	kolkata, _ := time.LoadLocation("Asia/Kolkata")
	ts := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v.UTC()
	}
	for _, tc := range []struct {
		query    string
		from, to string // expected, RFC 3339
		window   Window
		loc      *time.Location
		table    string
		rebin    string
		errPart  string
	}{
		{query: "", from: "2026-07-30T09:00:00Z", to: "2026-07-31T10:00:00Z", window: Hour, loc: time.UTC, table: "usage_hour"},
		{query: "window=minute", from: "2026-07-31T08:15:00Z", to: "2026-07-31T09:16:00Z", window: Minute, loc: time.UTC, table: "usage_minute"},
		{query: "window=day&from=2026-07-01T00:00:00Z&to=2026-07-31T00:00:00Z", from: "2026-07-01T00:00:00Z", to: "2026-07-31T00:00:00Z", window: Day, loc: time.UTC, table: "usage_day"},
		{query: "window=day&tz=Europe/Paris&from=2026-07-01T12:00:00Z&to=2026-07-02T12:00:00Z", from: "2026-06-30T22:00:00Z", to: "2026-07-02T22:00:00Z", window: Day, loc: paris, table: "usage_hour", rebin: "toStartOfDay"},
		{query: "window=hour&tz=Europe/Paris&from=2026-07-01T12:10:00Z&to=2026-07-01T13:00:00Z", from: "2026-07-01T12:00:00Z", to: "2026-07-01T13:00:00Z", window: Hour, loc: paris, table: "usage_hour"},
		{query: "window=hour&tz=Asia/Kolkata&from=2026-07-01T12:10:00Z&to=2026-07-01T13:00:00Z", from: "2026-07-01T11:30:00Z", to: "2026-07-01T13:30:00Z", window: Hour, loc: kolkata, table: "usage_minute", rebin: "toStartOfHour"},
		{query: "window=day&tz=Asia/Kolkata&from=2026-07-01T00:00:00Z&to=2026-07-02T00:00:00Z", from: "2026-06-30T18:30:00Z", to: "2026-07-02T18:30:00Z", window: Day, loc: kolkata, table: "usage_minute", rebin: "toStartOfDay"},
		{query: "from=2026-07-02T00:00:00Z&to=2026-07-01T00:00:00Z", errPart: "from must be before to"},
		{query: "from=2026-07-01T00:00:00Z&to=2026-07-01T00:00:00Z", errPart: "from must be before to"},
		{query: "window=minute&from=2026-07-01T00:00:00Z&to=2026-07-04T00:00:00Z", errPart: "range too long for window=minute"},
		{query: "window=hour&from=2026-01-01T00:00:00Z&to=2026-07-04T00:00:00Z", errPart: "range too long for window=hour"},
		{query: "window=week", errPart: "window must be one of"},
		{query: "from=yesterday", errPart: "from must be an RFC 3339 time"},
		{query: "to=2026-13-01T00:00:00Z", errPart: "to must be an RFC 3339 time"},
		{query: "tz=Mars/Olympus", errPart: "not a known IANA time zone"},
		{query: "tz=../../etc/passwd", errPart: "tz must be an IANA time zone name"},
		{query: "tz=Local", errPart: "tz must be an IANA time zone name"},
		{query: "group_by=key", errPart: "group_by must be scope"},
		{query: "group_by=scope,scope", errPart: "group_by must be scope, region or scope,region"},
		{query: "group_by=region,", errPart: "group_by must be scope, region or scope,region"},
		{query: "scope=", errPart: "scope must not be empty"},
		{query: "scope=" + strings.Repeat("s", 129), errPart: "scope must be at most 128 bytes"},
		{query: "key=a%00b", errPart: "key must not contain control characters"},
		{query: "window=hour&window=day", errPart: "window must be given once"},
		{query: "windw=hour", errPart: `unknown parameter "windw"`},
		{query: "window=week&from=x", errPart: "window must be one of minute, hour, day; from must be an RFC 3339"},
	} {
		q, err := url.ParseQuery(tc.query)
		if err != nil {
			t.Fatal(err)
		}
		p, err := ParseUsageParams(q, now)
		if tc.errPart != "" {
			var pe *ParamError
			if !errors.As(err, &pe) || !strings.Contains(err.Error(), tc.errPart) {
				t.Errorf("%q: got %v, want an error containing %q", tc.query, err, tc.errPart)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.query, err)
			continue
		}
		if !p.From.Equal(ts(tc.from)) || !p.To.Equal(ts(tc.to)) || p.Window != tc.window || p.Loc.String() != tc.loc.String() {
			t.Errorf("%q: got %s..%s %s %s, want %s..%s %s %s", tc.query, p.From, p.To, p.Window, p.Loc, tc.from, tc.to, tc.window, tc.loc)
		}
		if q := planUsage("db", p, "k"); q.table != tc.table || q.rebin != tc.rebin {
			t.Errorf("%q: plan %s/%s, want %s/%s", tc.query, q.table, q.rebin, tc.table, tc.rebin)
		}
	}
}

func TestBucketsAcrossDST(t *testing.T) {
	paris, _ := time.LoadLocation("Europe/Paris")
	// 2026-10-25 is 25 hours long in Paris.
	from := bucketFloor(time.Date(2026, 10, 25, 12, 0, 0, 0, paris), Day, paris)
	to := bucketCeil(time.Date(2026, 10, 25, 12, 0, 0, 0, paris), Day, paris)
	if from.In(paris).Hour() != 0 || to.Sub(from) != 25*time.Hour {
		t.Fatalf("day of 2026-10-25 in Paris: %s..%s", from, to)
	}
	// During the repeated hour 02:00-03:00, hour buckets stay one hour wide.
	t0 := time.Date(2026, 10, 25, 0, 30, 0, 0, time.UTC) // 02:30 CEST
	t1 := t0.Add(time.Hour)                              // 02:30 CET
	if f0, f1 := bucketFloor(t0, Hour, paris), bucketFloor(t1, Hour, paris); f1.Sub(f0) != time.Hour {
		t.Fatalf("hour floors %s %s", f0, f1)
	}
}

func TestParseTopKeysParams(t *testing.T) {
	now := time.Date(2026, 7, 31, 9, 15, 30, 0, time.UTC)
	for _, tc := range []struct {
		query, table, errPart string
		limit                 int
	}{
		{query: "", table: "usage_minute", limit: 10},
		{query: "from=2026-07-01T00:00:00Z&to=2026-07-31T00:00:00Z&limit=3", table: "usage_day", limit: 3},
		{query: "from=2026-07-01T05:00:00Z&to=2026-07-31T00:00:00Z", table: "usage_hour", limit: 10},
		{query: "limit=0", errPart: "limit must be an integer from 1 to 1000"},
		{query: "limit=10%3BDROP", errPart: "limit must be an integer"},
		{query: "from=2020-01-01T00:00:00Z", errPart: "range too long"},
	} {
		q, _ := url.ParseQuery(tc.query)
		p, err := ParseTopKeysParams(q, now)
		if tc.errPart != "" {
			if err == nil || !strings.Contains(err.Error(), tc.errPart) {
				t.Errorf("%q: got %v, want %q", tc.query, err, tc.errPart)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.query, err)
			continue
		}
		if q := planTopKeys("db", p); q.table != tc.table || q.limit != tc.limit {
			t.Errorf("%q: %s limit %d, want %s limit %d", tc.query, q.table, q.limit, tc.table, tc.limit)
		}
	}
}

// FuzzParseUsageParams: any query string either fails with a ParamError or
// yields parameters inside every limit whose SQL carries no literal at all
// (every value is a bound argument).
func FuzzParseUsageParams(f *testing.F) {
	for _, s := range []string{
		"", "window=minute", "window=day&tz=Asia/Kolkata&group_by=scope&scope=api:search",
		"from=2026-07-01T00:00:00Z&to=2026-07-02T00:00:00Z", "key=acct_1'%20OR%201=1--",
		"scope=%27%3B%20DROP%20TABLE%20x%3B--", "tz=Europe/Paris&window=hour", "from=2026-07-01T00:00:00%2B05:30",
	} {
		f.Add(s)
	}
	now := time.Date(2026, 7, 31, 9, 15, 30, 0, time.UTC)
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		p, err := ParseUsageParams(q, now)
		if err != nil {
			var pe *ParamError
			if !errors.As(err, &pe) || len(pe.Problems) == 0 {
				t.Fatalf("%q: error %v is not a ParamError", raw, err)
			}
			return
		}
		if !p.From.Before(p.To) || p.To.Sub(p.From) > MaxRange(p.Window) {
			t.Fatalf("%q: range %s..%s for %s", raw, p.From, p.To, p.Window)
		}
		if checkText(p.Scope, MaxScopeLen) != "" && p.Scope != "" {
			t.Fatalf("%q: bad scope accepted", raw)
		}
		sql, args := planUsage("db", p, "k").toSQL()
		if strings.ContainsAny(sql, "'\"`\\;") {
			t.Fatalf("%q: SQL carries a literal or separator: %s", raw, sql)
		}
		if n := strings.Count(sql, "?"); n != len(args) {
			t.Fatalf("%q: %d placeholders, %d args: %s", raw, n, len(args), sql)
		}
	})
}

func TestParseGroupBy(t *testing.T) {
	now := time.Date(2026, 7, 31, 9, 15, 30, 0, time.UTC)
	for _, tc := range []struct {
		q             string
		scope, region bool
	}{
		{"", false, false}, {"group_by=", false, false}, {"group_by=scope", true, false},
		{"group_by=region", false, true}, {"group_by=scope,region", true, true}, {"group_by=region,scope", true, true},
	} {
		q, _ := url.ParseQuery(tc.q)
		p, err := ParseUsageParams(q, now)
		if err != nil || p.GroupByScope != tc.scope || p.GroupByRegion != tc.region {
			t.Errorf("%q: scope %v region %v err %v, want %v %v", tc.q, p.GroupByScope, p.GroupByRegion, err, tc.scope, tc.region)
		}
		if pl := planUsage("db", p, "k"); pl.byRegion != tc.region {
			t.Errorf("%q: plan byRegion %v", tc.q, pl.byRegion)
		}
	}
}
