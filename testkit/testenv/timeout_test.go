package testenv

import (
	"testing"
	"time"
)

func TestParseScale(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want float64
		ok   bool
	}{
		{"", 1, true},
		{"1", 1, true},
		{"3", 3, true},
		{"0.5", 0.5, true},
		{"1000", 1000, true},
		{"0", 0, false},
		{"-2", 0, false},
		{"NaN", 0, false},
		{"1e9", 0, false},
		{"3x", 0, false},
	} {
		got, err := parseScale(tc.in)
		if (err == nil) != tc.ok || tc.ok && got != tc.want {
			t.Errorf("parseScale(%q) = %v, %v; want %v (ok %v)", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

// WaitFor returns once the condition holds, and Poll names the deadline
// when it never does.
func TestWaitForAndPoll(t *testing.T) {
	n := 0
	WaitFor(t, time.Minute, "the third poll", func() bool { n++; return n == 3 })
	if n != 3 {
		t.Fatalf("WaitFor returned after %d polls, want 3", n)
	}
	if err := Poll(0, func() bool { return false }); err == nil {
		t.Fatal("Poll of a condition that never holds returned nil")
	}
}
