package policyctl

import (
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/policylog"
)

func TestParseShare(t *testing.T) {
	for in, want := range map[string]float64{"0.5%": 0.005, "0.005": 0.005, "0%": 0, "100%": 1, " 2% ": 0.02} {
		if got, err := parseShare(in); err != nil || got != want {
			t.Errorf("parseShare(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x", "101%", "-1%", "1.5", "NaN"} {
		if _, err := parseShare(in); err == nil {
			t.Errorf("parseShare(%q) accepted", in)
		}
	}
}

func TestRolloutBound(t *testing.T) {
	if b, err := rolloutBound(0, ""); err != nil || b != 0 {
		t.Errorf("a plain push: %v, %v", b, err)
	}
	if b, err := rolloutBound(time.Hour, "0.5%"); err != nil || b != 0.005 {
		t.Errorf("1h, 0.5%%: %v, %v", b, err)
	}
	for _, c := range []struct {
		d     time.Duration
		share string
	}{{time.Hour, ""}, {0, "1%"}, {-time.Hour, "1%"}, {policylog.MaxShadowFor + time.Second, "1%"}, {time.Hour, "x"}} {
		if _, err := rolloutBound(c.d, c.share); err == nil {
			t.Errorf("rolloutBound(%s, %q) accepted", c.d, c.share)
		}
	}
}
