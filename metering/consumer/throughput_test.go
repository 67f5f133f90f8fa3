package consumer_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/internal/chconn"
	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/chsink"
	"github.com/ratewarden/ratewarden/metering/consumer"
	"github.com/ratewarden/ratewarden/metering/kafkaemit"
	"github.com/ratewarden/ratewarden/schema"
	"github.com/ratewarden/ratewarden/testkit/kafkadev"
	"github.com/ratewarden/ratewarden/testkit/proccpu"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

var e2eRate = flag.Int("meter.rate", 100_000, "BenchmarkEndToEnd: events per second the emitter is fed (0 = as fast as possible)")
var e2eWait = flag.Duration("meter.wait", 500*time.Millisecond, "BenchmarkEndToEnd: the consumer's BatchWait")
var e2eLog = flag.String("meter.log", "", "BenchmarkEndToEnd: write the debug logs of the emitter and the consumer to this file")
var e2eBuffer = flag.Int("meter.buffer", 0, "BenchmarkEndToEnd: the emitter's buffer in events (0 = its default, 65,536)")
var e2eConsumers = flag.Int("meter.consumers", 1, "BenchmarkEndToEnd: consumers in the group (each its own consumer.Consumer and ClickHouse connections)")
var e2eCluster = flag.Bool("meter.cluster", false, "BenchmarkEndToEnd: write into a 2 shards × 2 replicas ClickHouse with ZooKeeper (cluster mode) instead of one server")
var e2ePartitions = flag.Int("meter.partitions", 4, "BenchmarkEndToEnd: partitions of the topic")
var e2eBrokerProc = flag.Bool("meter.broker-process", true, "BenchmarkEndToEnd: run the broker in a process of its own (this test binary re-executed), so that its CPU is measured apart from the product's")

// chCluster is BenchmarkEndToEnd's cluster (-meter.cluster).
var chCluster testenv.SharedClickHouseCluster

// BenchmarkEndToEnd feeds b.N decision events through the whole pipeline —
// kafkaemit.Emitter → kfake (4 partitions) → consumer → ClickHouse rollups —
// at -meter.rate events/s (-meter.consumers consumers in one group, into
// one ClickHouse or, with -meter.cluster, a 2 × 2 cluster), and reports the end-to-end rate (events/s, from
// the first Emit until the last event is in every table, so it includes
// the final batch's wait), the rate at which events reached ClickHouse
// while the emitter was running (written-while-emitting/s), the consumer lag
// (seconds between an event's Emit and its batch being in ClickHouse,
// sampled every 50 ms: p50, p99, max) and the emitter's drops.
//
//	go test ./metering/consumer -run '^$' -bench EndToEnd -benchtime 3000000x -meter.rate 100000
func BenchmarkEndToEnd(b *testing.B) {
	if b.N < 10_000 {
		return // the framework's probe run
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var conn driver.Conn // reads the totals (through the Distributed tables in cluster mode)
	var db string
	var newSink func(obs chsink.Observer) (consumer.Sink, error)
	if *e2eCluster {
		c := chCluster.Get(b)
		db = c.Database(b)
		conn = c.Shards[0][0].Conn(b)
		if err := schema.ApplyCluster(ctx, c.ShardConns(b), db, c.Name); err != nil {
			b.Fatal(err)
		}
		newSink = func(obs chsink.Observer) (consumer.Sink, error) {
			var shards [][]driver.Conn
			for _, s := range c.Shards {
				var rs []driver.Conn
				for _, n := range s {
					rs = append(rs, n.Conn(b))
				}
				shards = append(shards, rs)
			}
			return chsink.NewSharded(shards, db, obs)
		}
	} else {
		conn = ch.Conn(b)
		db = ch.Database(b)
		if err := applySchema(ctx, conn, db); err != nil {
			b.Fatal(err)
		}
		// The sink's pool as cmd/meter-consumer opens it.
		newSink = func(obs chsink.Observer) (consumer.Sink, error) {
			pool, err := chconn.Config{Addr: ch.Addr(), User: "default"}.Open(chsink.Pool)
			if err != nil {
				return nil, err
			}
			b.Cleanup(func() { pool.Close() })
			return chsink.New(pool, db, obs)
		}
	}
	// A bounded log (64 MiB per partition, ~25 s at 100,000 events/s)
	// keeps kfake's memory, which lives in this process, from growing
	// with the run.
	var k broker
	var brokerPid int
	if *e2eBrokerProc {
		bp, err := startBrokerProcess("decisions", *e2ePartitions)
		if err != nil {
			b.Fatal(err)
		}
		defer bp.close()
		k, brokerPid = bp, bp.cmd.Process.Pid
	} else {
		kb, err := testenv.NewKafkaWith(kafkadev.Config{Topic: "decisions", Partitions: *e2ePartitions, RetentionBytes: 64 << 20})
		if err != nil {
			b.Fatal(err)
		}
		defer kb.Close()
		k = kb
	}
	var logOut io.Writer = io.Discard
	if *e2eLog != "" {
		f, err := os.Create(*e2eLog)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		logOut = f
	}
	log := slog.New(slog.NewJSONHandler(logOut, &slog.HandlerOptions{Level: slog.LevelDebug}))

	var regs []*prometheus.Registry
	runCtx, stop := context.WithCancel(context.Background())
	var running sync.WaitGroup
	defer func() { stop(); running.Wait() }()
	for i := 0; i < *e2eConsumers; i++ {
		reg := prometheus.NewRegistry()
		regs = append(regs, reg)
		obs, err := consumer.InsertMetrics(reg)
		if err != nil {
			b.Fatal(err)
		}
		sink, err := newSink(obs)
		if err != nil {
			b.Fatal(err)
		}
		c, err := consumer.New(consumer.Config{Brokers: []string{k.Addr()}, Topic: k.Topic(), Sink: sink, Ping: conn.Ping,
			BatchWait: *e2eWait, Logger: log.With("consumer", i), Registry: reg})
		if err != nil {
			b.Fatal(err)
		}
		running.Add(1)
		go func() { defer running.Done(); _ = c.Run(runCtx) }()
	}

	em, err := kafkaemit.New(kafkaemit.Config{Brokers: []string{k.Addr()}, Topic: k.Topic(), Buffer: *e2eBuffer,
		Logger: log, Registry: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	emCtx, stopEm := context.WithCancel(context.Background())
	emDone := make(chan error, 1)
	go func() { emDone <- em.Run(emCtx) }()
	defer func() { stopEm(); <-emDone }()

	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprintf("acct_%04d", i)
	}
	scopes := []string{"api:search", "api:read", "api:write"}
	ids := metering.NewIDs()
	const stamp = 1024
	emitAt := make([]time.Time, b.N/stamp+1) // when event i*stamp was emitted

	written := func() float64 {
		var w float64
		for _, reg := range regs {
			w += gatherCounter(reg, "meter_events_written_total")
		}
		return w
	}
	var lags []float64
	sample := func(emitted int) {
		w := int(written())
		if w >= emitted {
			lags = append(lags, 0)
			return
		}
		lags = append(lags, time.Since(emitAt[w/stamp]).Seconds())
	}

	// CPU seconds of this process (emitter, kfake, consumers) and of the
	// clickhouse-server processes, per million delivered events: with everything on
	// the same cores, the ceiling is where their sum fills the machine.
	var chPids []int
	if *e2eCluster {
		for _, n := range chCluster.Get(b).Nodes() {
			chPids = append(chPids, n.Process().Pid())
		}
	} else {
		chPids = append(chPids, ch.Process().Pid())
	}
	chCPU := func() float64 {
		var s float64
		for _, pid := range chPids {
			c, _ := proccpu.Of(pid) // 0 for a process that is gone
			s += c.Seconds()
		}
		return s
	}
	brokerCPU := func() float64 {
		if brokerPid == 0 {
			return 0
		}
		c, _ := proccpu.Of(brokerPid)
		return c.Seconds()
	}
	goCPU0, chCPU0, brCPU0 := proccpu.Self().Seconds(), chCPU(), brokerCPU()

	b.ResetTimer()
	start := time.Now()
	lastSample := start
	n := 0
	for n < b.N {
		now := time.Now()
		target := b.N
		if *e2eRate > 0 {
			target = min(b.N, int(now.Sub(start).Seconds()*float64(*e2eRate))+1)
		}
		for ; n < target; n++ {
			if n%stamp == 0 {
				emitAt[n/stamp] = now
			}
			em.Emit(metering.Event{EventID: ids.Next(now), TS: now.UnixMilli(), Key: keys[n%len(keys)], Scope: scopes[n%3],
				Tier: "pro", Cost: 1, Allowed: n%10 != 0, Source: "shared", Remaining: 10, Limit: 100, Policy: "pro", Instance: "bench"})
		}
		if now.Sub(lastSample) >= 50*time.Millisecond {
			sample(n)
			lastSample = now
		}
		time.Sleep(time.Millisecond)
	}
	emitEnd := time.Now()
	writtenAtEmitEnd := written()
	deadline := time.Now().Add(testenv.Timeout(10 * time.Minute))
	for int(written())+int(em.Dropped()) < b.N {
		if time.Now().After(deadline) {
			b.Fatalf("only %v of %d events written after 10 minutes", written(), b.N)
		}
		sample(b.N)
		time.Sleep(50 * time.Millisecond)
	}
	elapsed := time.Since(start)
	b.StopTimer()

	sort.Float64s(lags)
	q := func(p float64) float64 { return lags[min(len(lags)-1, int(p*float64(len(lags))))] }
	b.ReportMetric(float64(uint64(b.N)-em.Dropped())/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(b.N)/emitEnd.Sub(start).Seconds(), "emitted/s")
	b.ReportMetric(writtenAtEmitEnd/emitEnd.Sub(start).Seconds(), "written-while-emitting/s")
	b.ReportMetric(q(0.5), "lag-p50-s")
	b.ReportMetric(q(0.99), "lag-p99-s")
	b.ReportMetric(lags[len(lags)-1], "lag-max-s")
	b.ReportMetric(float64(em.Dropped()), "dropped")
	delivered := float64(uint64(b.N) - em.Dropped())
	// With the broker in its own process, this process is the product
	// (emitter and consumers) plus the load loop; without, kfake too.
	b.ReportMetric((proccpu.Self().Seconds()-goCPU0)/delivered*1e6, "go-cpu-s/Mevent")
	b.ReportMetric((brokerCPU()-brCPU0)/delivered*1e6, "broker-cpu-s/Mevent")
	b.ReportMetric((chCPU()-chCPU0)/delivered*1e6, "ch-cpu-s/Mevent")

	// The rollups hold every event exactly once: never more, and all of
	// them once the last INSERTs are visible (written counts a batch that
	// must be written again after a partial failure twice, and in cluster
	// mode the Distributed table may read a replica that is a part behind).
	want := uint64(b.N) - em.Dropped()
	deadline = time.Now().Add(testenv.Timeout(2 * time.Minute))
	for {
		var total uint64
		// A fresh deadline: ctx (set up for the schema) may have run out
		// during a long run.
		qctx, qcancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := conn.QueryRow(qctx, "SELECT sum(requests) FROM "+db+".usage_day WHERE key != ''").Scan(&total)
		qcancel()
		if err != nil {
			b.Fatal(err)
		}
		if total > want {
			b.Fatalf("usage_day holds %d requests, more than the %d delivered", total, want)
		}
		if total == want {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("usage_day holds %d requests 2 minutes after the run, want %d", total, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func gatherCounter(reg *prometheus.Registry, name string) float64 {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}
