package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement/keyslot"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// peek posts /check with "peek": true.
func (p *limiterProc) peek(t testing.TB, key, scope string) (decision, int) {
	t.Helper()
	body := fmt.Sprintf(`{"key":%q,"scope":%q,"peek":true}`, key, scope)
	resp, err := client.Post(p.url+"/check", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST /check peek: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var d decision
	if resp.StatusCode == 200 {
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatalf("decode %q: %v", b, err)
		}
	}
	return d, resp.StatusCode
}

// TestPeekOverHTTP is the contract's peek on the real limiter: POST /check
// with "peek": true answers as /check would, leaves the key's bucket in
// Redis byte for byte as it was, and puts no decision on the metering
// topic; on an exhausted key it answers a rejection with the store's
// retry time.
func TestPeekOverHTTP(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	const topic = "ratelimit.decisions"
	k := testenv.StartKafka(t, topic, 1)
	p := startLimiter(t, meteringPolicy, "REDIS_ADDRS="+r.Addr(), "KAFKA_BROKERS="+k.Addr(), "KAFKA_TOPIC="+topic)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer rdb.Close()
	bucket := func() string {
		v, err := rdb.Get(context.Background(), keyslot.BucketKey("rl", "acct", "api")).Result()
		if err != nil {
			t.Fatalf("read the bucket: %v", err)
		}
		return v
	}

	if d, status := p.check(t, "acct", "api", 1); status != 200 || !d.Allowed || d.Remaining != 4 {
		t.Fatalf("first check: %d %+v", status, d)
	}
	before := bucket()
	for range 20 {
		d, status := p.peek(t, "acct", "api")
		if status != 200 || !d.Allowed || d.Remaining != 3 || d.Source != "shared" {
			t.Fatalf("peek: %d %+v; want allowed, 3 left (what a check would say), source shared", status, d)
		}
	}
	if after := bucket(); after != before {
		t.Fatalf("peeks changed the bucket: %x → %x", before, after)
	}
	for range 4 {
		p.check(t, "acct", "api", 1)
	}
	d, status := p.peek(t, "acct", "api")
	if status != 200 || d.Allowed || d.RetryAfterMs < 900_000 {
		t.Fatalf("peek of an exhausted key: %d %+v; want rejected for about 1000 s (rate 0.001)", status, d)
	}

	// The marker's event comes after every event the peeks could have
	// made (one partition, one producer): once it is there, a peek that
	// was recorded would be too.
	if _, status := p.check(t, "marker", "api", 1); status != 200 {
		t.Fatal("marker check failed")
	}
	var acct int
	eventually(t, "the marker's event on the topic", func() bool {
		evs := topicEvents(t, k.Addr(), topic)
		acct = 0
		seen := false
		for _, ev := range evs {
			switch ev.Key {
			case "acct":
				acct++
			case "marker":
				seen = true
			}
		}
		return seen
	})
	if acct != 5 {
		t.Fatalf("%d events of acct on the topic, want 5 (the checks, none of the 21 peeks)", acct)
	}
}
