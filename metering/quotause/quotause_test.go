package quotause_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/limits"
	"github.com/ratewarden/ratewarden/metering/quotause"
	"github.com/ratewarden/ratewarden/policy"
)

const pol = `version: 1
default_tier: free
tiers:
  free: { rate: 10, burst: 10 }
  pro:  { rate: 10, burst: 10, quota: { limit: 100, period: month } }
  big:  { rate: 10, burst: 10, quota: { limit: 1000, period: month } }
rules:
  - name: exports
    scope: "api:export"
    tier: pro
    quota: { limit: 5, period: hour }
  - name: beta
    scope: "api:beta"
    dry_run: true
keys: { k: big }
`

// Rows are attributed with the tier they were recorded under (a key that
// moved from pro to big keeps both counters), by scope, with dry-run and
// quota-less rows left out of Used.
func TestAttribute(t *testing.T) {
	p, err := policy.Parse([]byte(pol))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 3, 14, 15, 9, 26, 0, time.UTC)
	rows := []quotause.Row{
		{Key: "k", Scope: "api:search", Tier: "pro", Hour: 1, Day: 2, Month: 30},
		{Key: "k", Scope: "api:list", Tier: "pro", Hour: 1, Day: 2, Month: 7},
		{Key: "k", Scope: "api:export", Tier: "pro", Hour: 3, Day: 4, Month: 9},
		{Key: "k", Scope: "api:beta", Tier: "pro", Hour: 1, Day: 1, Month: 50},
		{Key: "k", Scope: "api:search", Tier: "big", Hour: 5, Day: 6, Month: 200},
		{Key: "k", Scope: "api:search", Tier: "gone", Month: 99},
		{Key: "f", Scope: "api:search", Tier: "free", Month: 10},
	}
	got, skipped := quotause.Attribute(p, rows, now)
	month := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	hour := time.Date(2026, 3, 14, 15, 0, 0, 0, time.UTC)
	want := []quotause.Quota{
		{Key: "k", QuotaID: "rule:exports", Limit: 5, Period: limits.PeriodHour, Start: hour, End: hour.Add(time.Hour), Used: 3, Scopes: []string{"api:export"}},
		{Key: "k", QuotaID: "tier:big", Limit: 1000, Period: limits.PeriodMonth, Start: month, End: month.AddDate(0, 1, 0), Used: 200, Scopes: []string{"api:search"}},
		{Key: "k", QuotaID: "tier:pro", Limit: 100, Period: limits.PeriodMonth, Start: month, End: month.AddDate(0, 1, 0), Used: 37, DryRunUsed: 50, Scopes: []string{"api:beta", "api:list", "api:search"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Attribute:\n got %+v\nwant %+v", got, want)
	}
	if skipped != (quotause.Skipped{NoQuota: 1, UnknownTier: 1}) {
		t.Errorf("skipped %+v", skipped)
	}
	if got[1].RedisKey("") != "rl:{k}:q:tier:big:"+"1772323200" {
		t.Errorf("RedisKey = %s", got[1].RedisKey(""))
	}
	res, _ := p.Resolve("k", "api:search", "")
	if q := quotause.For("k", res, got, now); q.Used != 200 {
		t.Errorf("For(tier:big) = %+v", q)
	}
	res, _ = p.Resolve("fresh", "x", "pro")
	if q := quotause.For("fresh", res, got, now); q.Used != 0 || q.QuotaID != "tier:pro" || q.Limit != 100 {
		t.Errorf("For(a counter with nothing recorded) = %+v", q)
	}
}
