package usage

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"testing"
	"time"
)

// BenchmarkUsage30DaysHourly measures GET /v1/usage end to end (HTTP,
// token check, ClickHouse query, JSON) for one key's 30 days of hourly data
// while usage_hour holds 1,000 keys × 5 scopes × 30 days of hours
// (3.6 million rows, in several parts, unmerged).
func BenchmarkUsage30DaysHourly(b *testing.B) {
	now := time.Date(2026, 7, 31, 0, 0, 0, 0, time.UTC)
	conn, err := sharedCH.Open()
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	e := newBenchEnv(b, conn, now)
	const keys, scopes, hours = 1000, 5, 30 * 24
	ctx := context.Background()
	start := now.Add(-hours * time.Hour)
	rows := 0
	for k0 := 0; k0 < keys; k0 += 100 {
		batch, err := conn.PrepareBatch(ctx, "INSERT INTO "+e.db+".usage_hour (key, scope, tier, start, requests, allowed, rejected, cost, warnings)")
		if err != nil {
			b.Fatal(err)
		}
		for k := k0; k < k0+100; k++ {
			for s := 0; s < scopes; s++ {
				for h := 0; h < hours; h++ {
					n := uint64(100 + (k+s+h)%50)
					if err := batch.Append(fmt.Sprintf("acct_%04d", k), fmt.Sprintf("api:s%d", s), "pro", start.Add(time.Duration(h)*time.Hour), n, n-n/10, n/10, n, uint64(0)); err != nil {
						b.Fatal(err)
					}
					rows++
				}
			}
		}
		if err := batch.Send(); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("usage_hour loaded with %d rows", rows)
	q := url.Values{"key": {"acct_0500"}, "from": {start.Format(time.RFC3339)}, "to": {now.Format(time.RFC3339)}}
	for _, bc := range []struct {
		name  string
		extra url.Values
		want  int
	}{
		{"window=hour,group_by=scope", url.Values{"window": {"hour"}, "group_by": {"scope"}}, hours * scopes},
		{"window=hour", url.Values{"window": {"hour"}}, hours},
		{"window=day,tz=Europe/Paris", url.Values{"window": {"day"}, "tz": {"Europe/Paris"}}, 31},
	} {
		b.Run(bc.name, func(b *testing.B) {
			qq := url.Values{}
			for k, v := range q {
				qq[k] = v
			}
			for k, v := range bc.extra {
				qq[k] = v
			}
			req, _ := http.NewRequest("GET", e.http.URL+"/v1/usage?"+qq.Encode(), nil)
			req.Header.Set("Authorization", "Bearer "+testAdmin)
			var lat []time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				var u usageResponse
				err = decodeJSON(resp, &u)
				if err != nil || resp.StatusCode != 200 || len(u.Series) < bc.want-scopes*24 {
					b.Fatalf("status %d, %d points, %v", resp.StatusCode, len(u.Series), err)
				}
				lat = append(lat, time.Since(t0))
			}
			b.StopTimer()
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
		})
	}
}
