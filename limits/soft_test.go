package limits

import "testing"

func TestSoftLimitReached(t *testing.T) {
	for _, c := range []struct {
		used, capacity, percent float64
		want                    bool
	}{
		{80, 100, 80, true},
		{79, 100, 80, false},
		{0.8 * 3, 3, 80, true}, // 2.4 of 3: float residue below 80 % still counts
		{1, 3, 100.0 / 3, true},
		{100, 100, 0, false}, // no soft limit
		{100, 100, -5, false},
		{5, 0, 50, false}, // no capacity
		{0, 100, 1e-12, true},
	} {
		if got := SoftLimitReached(c.used, c.capacity, c.percent); got != c.want {
			t.Errorf("SoftLimitReached(%v, %v, %v) = %v, want %v", c.used, c.capacity, c.percent, got, c.want)
		}
	}
	bucket := Limit{Burst: 10, SoftLimitPercent: 50, QuotaLimit: 100, QuotaPeriod: PeriodDay}
	for _, c := range []struct {
		left  float64
		quota int64
		want  bool
	}{{5, 0, true}, {5.5, 0, false}, {10, 50, true}, {10, 49, false}} {
		if got := bucket.SoftLimitReached(c.left, c.quota); got != c.want {
			t.Errorf("bucket %v left, quota %d used: %v, want %v", c.left, c.quota, got, c.want)
		}
	}
}
