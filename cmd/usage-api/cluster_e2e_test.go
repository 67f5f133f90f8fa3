package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"sort"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestUsageIdenticalOnOneServerAndOnTheCluster: the same events, sent to
// two brokers, are metered into a single ClickHouse (the default mode) and
// into a 2 shards × 2 replicas cluster (cluster mode: each Kafka
// partition's rows on its own shard); the usage API of each mode then
// gives byte-identical answers to the same questions: every key's series
// per minute, hour and day (with and without group_by, across a month
// boundary), one scope alone, and the top keys.
func TestUsageIdenticalOnOneServerAndOnTheCluster(t *testing.T) {
	t.Parallel()
	ch := testenv.StartClickHouse(t)
	c := testenv.StartClickHouseCluster(t, 2, 2)
	oneDB, clusterDB := ch.Database(t), c.Database(t)
	k1 := testenv.StartKafka(t, "ratelimit.decisions", 4)
	k2 := testenv.StartKafka(t, "ratelimit.decisions", 4)

	// 20,000 decisions over 12 keys and 3 scopes, from 22:00 on 30 Nov to
	// 02:00 on 1 Dec (UTC): two days and two months.
	base := time.Date(2026, 11, 30, 22, 0, 0, 0, time.UTC)
	ids := metering.NewIDs()
	evs := make([]metering.Event, 20_000)
	keyTotals := map[string]uint64{}
	for i := range evs {
		ts := base.UnixMilli() + int64(i)*4*3_600_000/int64(len(evs))
		evs[i] = metering.Event{
			EventID: ids.Next(time.UnixMilli(ts)), TS: ts,
			Key: fmt.Sprintf("acct_%02d", (i*7)%12), Scope: []string{"api:search", "api:read", "api:write"}[i%3], Tier: "pro",
			Cost: uint64(1 + i%4), Allowed: i%5 != 0, Source: "shared", Remaining: 1, Limit: 100,
			Policy: "pro", Warning: i%9 == 0, Instance: "lim-1",
		}
		keyTotals[evs[i].Key]++
	}
	for _, k := range []*testenv.Kafka{k1, k2} {
		w := &kafka.Writer{Addr: kafka.TCP(k.Addr()), Topic: k.Topic(), Balancer: &kafka.Hash{},
			BatchSize: 2000, BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireAll}
		msgs := make([]kafka.Message, len(evs))
		for i := range evs {
			msgs[i] = kafka.Message{Key: []byte(evs[i].Key), Value: evs[i].AppendEncode(nil)}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		err := w.WriteMessages(ctx, msgs...)
		cancel()
		w.Close()
		if err != nil {
			t.Fatalf("produce: %v", err)
		}
	}

	const admin = "e2e-admin-token-0123456789"
	apiEnv := []string{"USAGE_ADMIN_TOKEN=" + admin, "USAGE_TOKEN_SECRET=e2e-secret-0123456789abcdef"}
	one := []string{"KAFKA_BROKERS=" + k1.Addr(), "KAFKA_TOPIC=" + k1.Topic(), "CLICKHOUSE_ADDR=" + ch.Addr(), "CLICKHOUSE_DATABASE=" + oneDB}
	cl := []string{"KAFKA_BROKERS=" + k2.Addr(), "KAFKA_TOPIC=" + k2.Topic(), "CLICKHOUSE_ADDR=" + c.Shards[1][1].Addr(), "CLICKHOUSE_DATABASE=" + clusterDB,
		"CLICKHOUSE_CLUSTER=" + c.Name, "CLICKHOUSE_SHARDS=" + c.ShardsEnv()}
	start(t, "meter-consumer", "METER_ADDR", "/readyz", append(one, "METER_BATCH_WAIT=50ms", "METER_BATCH_SIZE=3000")...)
	start(t, "meter-consumer", "METER_ADDR", "/readyz", append(cl, "METER_BATCH_WAIT=50ms", "METER_BATCH_SIZE=3000")...)
	apiOne := start(t, "usage-api", "USAGE_API_ADDR", "/readyz", append(one, apiEnv...)...)
	apiCluster := start(t, "usage-api", "USAGE_API_ADDR", "/readyz", append(cl, apiEnv...)...)

	from, to := base.Add(-time.Hour).Format(time.RFC3339), base.Add(5*time.Hour).Format(time.RFC3339)
	var questions []string
	keys := make([]string, 0, len(keyTotals))
	for k := range keyTotals {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		for _, w := range []string{"minute", "hour", "day"} {
			q := url.Values{"key": {k}, "window": {w}, "from": {from}, "to": {to}}
			questions = append(questions, "/v1/usage?"+q.Encode())
			q.Set("group_by", "scope")
			questions = append(questions, "/v1/usage?"+q.Encode())
		}
		q := url.Values{"key": {k}, "window": {"hour"}, "from": {from}, "to": {to}, "scope": {"api:write"}, "tz": {"Asia/Kolkata"}}
		questions = append(questions, "/v1/usage?"+q.Encode())
	}
	questions = append(questions, "/v1/admin/top-keys?"+url.Values{"from": {from}, "to": {to}, "limit": {"100"}}.Encode())

	// Wait until both have metered everything (the top keys count every
	// request; counts never go down), then every answer must be the same.
	complete := func(api *proc) bool {
		code, b := call(t, "GET", api.url+questions[len(questions)-1], admin, "")
		if code != 200 {
			return false
		}
		var top struct {
			Keys []struct {
				Key      string
				Requests uint64
			}
		}
		if err := json.Unmarshal(b, &top); err != nil {
			return false
		}
		got := map[string]uint64{}
		for _, k := range top.Keys {
			got[k.Key] = k.Requests
		}
		return fmt.Sprint(got) == fmt.Sprint(keyTotals)
	}
	deadline := time.Now().Add(testenv.Timeout(3 * time.Minute))
	for !complete(apiOne) || !complete(apiCluster) {
		if time.Now().After(deadline) {
			t.Fatalf("not every event metered after 3 min (single node %v, cluster %v)", complete(apiOne), complete(apiCluster))
		}
		time.Sleep(300 * time.Millisecond)
	}
	// The cluster really is sharded: both shards hold some of the rows.
	for i, shard := range c.Shards {
		var n uint64
		if err := shard[0].Conn(t).QueryRow(context.Background(), "SELECT count() FROM "+clusterDB+".decisions_raw_local").Scan(&n); err != nil || n == 0 || n == uint64(len(evs)) {
			t.Fatalf("shard %d holds %d of %d rows (%v): not sharded", i+1, n, len(evs), err)
		}
	}
	// The three rollups are written by separate INSERTs, so give the
	// answers a moment to agree, then demand they do.
	var diff string
	deadline = time.Now().Add(testenv.Timeout(60 * time.Second))
	for {
		diff = ""
		for _, q := range questions {
			c1, b1 := call(t, "GET", apiOne.url+q, admin, "")
			c2, b2 := call(t, "GET", apiCluster.url+q, admin, "")
			if c1 != 200 || c1 != c2 || string(b1) != string(b2) {
				diff = fmt.Sprintf("%s:\n single node %d %.400s\n cluster     %d %.400s", q, c1, b1, c2, b2)
				break
			}
		}
		if diff == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the usage API answers differently on the cluster: %s", diff)
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("%d questions answered identically by the single-node and the cluster usage API", len(questions))
}
