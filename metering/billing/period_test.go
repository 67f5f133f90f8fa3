package billing

import (
	"errors"
	"testing"
	"time"
)

func TestParsePeriod(t *testing.T) {
	for _, tc := range []struct {
		period, tz string
		start, end string // RFC 3339 in UTC; "" = refused
	}{
		{"2026-03", "", "2026-03-01T00:00:00Z", "2026-04-01T00:00:00Z"},
		{"2026-12", "UTC", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z"},
		{"2026-03", "Asia/Kolkata", "2026-02-28T18:30:00Z", "2026-03-31T18:30:00Z"},   // +05:30: minutes at both edges
		{"2026-03", "Asia/Kathmandu", "2026-02-28T18:15:00Z", "2026-03-31T18:15:00Z"}, // +05:45
		{"2026-03", "Europe/Paris", "2026-02-28T23:00:00Z", "2026-03-31T22:00:00Z"},   // DST starts within the month
		{"2026-11", "America/New_York", "2026-11-01T04:00:00Z", "2026-12-01T05:00:00Z"},
		{"1971-06", "Africa/Monrovia", "", ""}, // -00:44:30 until 1972: not a whole minute
		{"2026-3", "", "", ""},
		{"2026-13", "", "", ""},
		{"26-03", "", "", ""},
		{"2026-03-01", "", "", ""},
		{"1969-12", "", "", ""},
		{"2026-03", "Mars/Olympus", "", ""},
	} {
		p, err := ParsePeriod(tc.period, tc.tz)
		if tc.start == "" {
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("%s in %q: %v, want ErrInvalid", tc.period, tc.tz, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s in %q: %v", tc.period, tc.tz, err)
			continue
		}
		s, e := p.Bounds()
		if got := s.UTC().Format(time.RFC3339); got != tc.start {
			t.Errorf("%s in %q starts %s, want %s", tc.period, tc.tz, got, tc.start)
		}
		if got := e.UTC().Format(time.RFC3339); got != tc.end {
			t.Errorf("%s in %q ends %s, want %s", tc.period, tc.tz, got, tc.end)
		}
		if p.String() != tc.period {
			t.Errorf("String %s, want %s", p, tc.period)
		}
	}
}

func TestPeriodState(t *testing.T) {
	p, err := ParsePeriod("2026-03", "Asia/Kolkata")
	if err != nil {
		t.Fatal(err)
	}
	end := time.Date(2026, 3, 31, 18, 30, 0, 0, time.UTC)
	grace := 72 * time.Hour
	for _, tc := range []struct {
		now  time.Time
		want string
	}{
		{end.Add(-time.Millisecond), StateOpen},
		{end, StateClosing},
		{end.Add(grace - time.Millisecond), StateClosing},
		{end.Add(grace), StateFinal},
		{end.AddDate(1, 0, 0), StateFinal},
	} {
		if got := p.State(tc.now, grace); got != tc.want {
			t.Errorf("at %s: %s, want %s", tc.now, got, tc.want)
		}
	}
	if n := p.Next(); n.String() != "2026-04" || n.TZ() != "Asia/Kolkata" {
		t.Errorf("Next %s %s", n, n.TZ())
	}
	if n := p.Add(-3); n.String() != "2025-12" {
		t.Errorf("Add(-3) %s", n)
	}
}
