package usage

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/chsink"
)

type regionUsage struct {
	Source string `json:"source"`
	Series []struct {
		Start  string  `json:"start"`
		Scope  string  `json:"scope"`
		Region *string `json:"region"`
		Counts
	} `json:"series"`
	Totals Counts `json:"totals"`
}

// group_by=region: one series per region, the usage recorded without a
// region as region "", and their sum in every bucket equal to the
// ungrouped answer (written by the meter-consumer's own sink).
func TestUsageGroupedByRegion(t *testing.T) {
	e := newEnv(t, sharedCH, testNow)
	sink, err := chsink.New(e.conn, e.db, nil)
	if err != nil {
		t.Fatal(err)
	}
	base := testNow.Truncate(time.Hour).Add(-2 * time.Hour)
	var recs []chsink.Record
	want := map[string]map[string]uint64{} // hour → region → cost
	regions := []string{"a", "b", "c", ""}
	for i := 0; i < 120; i++ {
		ts := base.Add(time.Duration(i) * time.Minute)
		r := regions[i%4]
		scope := []string{"api:search", "api:write"}[i%2]
		ev := metering.Event{EventID: fmt.Sprintf("ev%04d", i), TS: ts.UnixMilli(), Key: "acct_g", Scope: scope, Tier: "pro",
			Cost: uint64(1 + i%3), Allowed: i%5 != 0, Source: "shared", Region: r}
		recs = append(recs, chsink.Record{Offset: int64(i), Event: ev})
		h := ts.Truncate(time.Hour).Format(time.RFC3339)
		if want[h] == nil {
			want[h] = map[string]uint64{}
		}
		if ev.Allowed {
			want[h][r] += ev.Cost
		}
	}
	ctx := context.Background()
	p, err := sink.Progress(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := sink.Write(ctx, 0, recs, 119, &p); err != nil {
		t.Fatal(err)
	}
	from, to := base.Format(time.RFC3339), testNow.Format(time.RFC3339)
	code, b := e.do("GET", "/v1/usage?key=acct_g&window=hour&from="+from+"&to="+to, testAdmin, "")
	if code != 200 {
		t.Fatalf("usage: %d %s", code, b)
	}
	all := decode[regionUsage](t, b)
	for _, path := range []string{"group_by=region", "group_by=scope,region"} {
		code, b = e.do("GET", "/v1/usage?key=acct_g&window=hour&from="+from+"&to="+to+"&"+path, testAdmin, "")
		if code != 200 {
			t.Fatalf("%s: %d %s", path, code, b)
		}
		got := decode[regionUsage](t, b)
		if got.Totals != all.Totals {
			t.Fatalf("%s: totals %+v, summed over regions %+v", path, got.Totals, all.Totals)
		}
		per := map[string]map[string]uint64{}
		var sum Counts
		for _, pt := range got.Series {
			if pt.Region == nil {
				t.Fatalf("%s: a point without region: %s", path, b)
			}
			if per[pt.Start] == nil {
				per[pt.Start] = map[string]uint64{}
			}
			per[pt.Start][*pt.Region] += pt.Cost
			sum.add(pt.Counts)
		}
		if sum != all.Totals {
			t.Fatalf("%s: the regions sum to %+v, the key's usage is %+v", path, sum, all.Totals)
		}
		if fmt.Sprint(per) != fmt.Sprint(want) {
			t.Fatalf("%s: cost per hour and region %v, want %v", path, per, want)
		}
	}
	code, b = e.do("GET", "/v1/usage?key=acct_g&group_by=region,region", testAdmin, "")
	if code != 400 {
		t.Fatalf("group_by=region,region: %d %s", code, b)
	}
}
