package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/ratewarden/ratewarden/internal/kafkaconn"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/policylog/kafkalog"
	"github.com/ratewarden/ratewarden/testkit/heapstat"
	"github.com/ratewarden/ratewarden/testkit/kafkadev"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// startOverrides is the size of the log BenchmarkTailStartOverrides reads.
const startOverrides = 1_000_000

// BenchmarkTailStartOverrides is a limiter's start in log mode on a log of
// a document and 1,000,000 override records (half a tier, half a rate and
// burst, a quarter with a scope) held by kfake: the limiter's own tail
// code (newPolicyTail, start) reads the log to its end over the Kafka
// protocol, decodes, checks and applies every record and returns the
// policy to enforce. It reports the seconds of that start, the CPU
// seconds of the process meanwhile (kfake's serving the fetches included)
// and the live heap it leaves per override (runtime.MemStats after a full collection,
// kfake's copy of the log excluded: it is measured before the start).
func BenchmarkTailStartOverrides(b *testing.B) {
	// Unbounded: the broker's default retention (256 MiB) would drop the
	// start of a log of 1,000,000 records while it is read.
	k, err := testenv.NewKafkaWith(kafkadev.Config{Partitions: 1, RetentionBytes: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer k.Close()
	ctx := context.Background()
	l, err := kafkalog.New(kafkalog.Config{Brokers: []string{k.Addr()}, Security: &kafkaconn.Security{}})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	if err := l.Ensure(ctx); err != nil {
		b.Fatal(err)
	}
	w := policylog.NewClient(l, false)
	if _, err := w.Push(ctx, logDocA, "bench", "first", policylog.NoExpect); err != nil {
		b.Fatal(err)
	}
	fillOverrides(b, k.Addr(), startOverrides, 1)
	cfg := config{
		KafkaBrokers: []string{k.Addr()}, Kafka: &kafkaconn.Security{},
		PolicyLog: policyLogConfig{Source: sourceKafka, Topic: kafkalog.DefaultTopic, StartWait: 10 * time.Minute},
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	b.ResetTimer()
	for range b.N {
		measureStart(b, ctx, cfg, logger, "")
	}
}

// cpuTime is the CPU time (user and system) the process has used: the
// limiter's reading, and kfake's serving it, in the same process.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// fillOverrides appends n override records (revisions 2 … n+1, after the
// document's; base is the log's end before) to the policy topic on addr, in batches, as writers would
// have one by one.
func fillOverrides(b *testing.B, addr string, n int, base int64) {
	b.Helper()
	cl := &kafka.Client{Addr: kafka.TCP(addr), Timeout: time.Minute}
	const batch = 5000
	recs := make([]kafka.Record, 0, batch)
	flush := func() {
		res, err := cl.Produce(context.Background(), &kafka.ProduceRequest{
			Topic: kafkalog.DefaultTopic, Partition: 0, RequiredAcks: kafka.RequireAll,
			Records: kafka.NewRecordReader(recs...),
		})
		if err == nil {
			err = res.Error
		}
		if err != nil {
			b.Fatal(err)
		}
		recs = recs[:0]
	}
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for i := range n {
		o := &policy.Override{Tier: "pro", Reason: "negotiated deal"}
		if i%2 == 1 {
			o = &policy.Override{Rate: 50, Burst: 100, Reason: "negotiated deal"}
		}
		scope := ""
		if i%4 == 3 {
			scope = "api:search"
		}
		r := policylog.Record{Revision: int64(i + 2), Parent: int64(i + 1), Kind: policylog.KindOverride, Author: "billing",
			Message: "negotiated deal", Time: t0.Add(time.Duration(i) * time.Millisecond),
			Key: fmt.Sprintf("acct_%07d", i), Scope: scope, Override: o}
		r.Seal()
		v, err := r.Encode()
		if err != nil {
			b.Fatal(err)
		}
		recs = append(recs, kafka.Record{Key: kafka.NewBytes([]byte(r.LogKey())), Value: kafka.NewBytes(v), Time: r.Time})
		if len(recs) == batch {
			flush()
		}
	}
	if len(recs) > 0 {
		flush()
	}
	res, err := cl.ListOffsets(context.Background(), &kafka.ListOffsetsRequest{
		Topics: map[string][]kafka.OffsetRequest{kafkalog.DefaultTopic: {kafka.LastOffsetOf(0)}},
	})
	if err != nil {
		b.Fatal(err)
	}
	if p := res.Topics[kafkalog.DefaultTopic]; len(p) != 1 || p[0].LastOffset != base+int64(n) {
		b.Fatalf("the log ends at %+v, want offset %d", p, base+int64(n))
	}
}

// measureStart starts one policy log follower on cfg and reports the
// start's wall time, CPU time and live heap per override, with the
// metrics' names prefixed by prefix. It fails unless the follower started
// from the log with startOverrides overrides.
func measureStart(b *testing.B, ctx context.Context, cfg config, logger *slog.Logger, prefix string) {
	b.Helper()
	before := heapstat.Live()
	cpu0 := cpuTime()
	start := time.Now()
	reg := prometheus.NewRegistry()
	tail, err := newPolicyTail(cfg, reg, logger)
	if err != nil {
		b.Fatal(err)
	}
	pol, err := tail.Start(ctx)
	if err != nil {
		b.Fatal(err)
	}
	took := time.Since(start)
	cpu := cpuTime() - cpu0
	after := heapstat.Live()
	if got := tail.Current(); got.Source != sourceKafka || got.Overrides != startOverrides {
		b.Fatalf("started from %s with %d overrides, want kafka with %d", got.Source, got.Overrides, startOverrides)
	}
	b.ReportMetric(took.Seconds(), prefix+"s/start")
	b.ReportMetric(cpu.Seconds(), prefix+"cpu-s/start")
	b.ReportMetric(float64(int64(after)-int64(before))/startOverrides, prefix+"bytes/override")
	// 1 when the start relied on a checkpoint that matched (signed logs).
	b.ReportMetric(counterValue(b, reg, "limiter_policy_log_checkpoints_total", "matched"), prefix+"checkpoint-matched")
	runtime.KeepAlive(pol)
	tail.Close()
}

// counterValue is the value of the counter name{result=result} in reg (0
// when absent).
func counterValue(b *testing.B, reg *prometheus.Registry, name, result string) float64 {
	b.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
