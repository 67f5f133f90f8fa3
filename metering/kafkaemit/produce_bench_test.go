package kafkaemit_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/kafkaemit"
	"github.com/ratewarden/ratewarden/metering/spool"
	"github.com/ratewarden/ratewarden/testkit/proccpu"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

var (
	produceCodec = flag.String("emit.codec", "lz4", "BenchmarkProduce: none, snappy, lz4, zstd or gzip")
	produceBatch = flag.Int("emit.batch", 0, "BenchmarkProduce: the emitter's BatchSize (0 = its default)")
	produceSpool = flag.Bool("emit.spool", false, "BenchmarkProduce: with a spool (idle unless Kafka fails)")
)

// BenchmarkProduce measures the emitter alone, encode and produce, with the
// broker in its own process (cmd/kafka-dev, built and started here) so that
// this process's CPU is the emitter's (plus the loop calling Emit, about
// 30 ns an event): b.N events over 1,000 keys, as fast as Kafka acknowledges
// them without a drop (the loop waits while more than half the buffer is
// unacknowledged). Reports the CPU per event of this process and of the
// broker, and the events acknowledged per second.
//
//	go test ./metering/kafkaemit -run '^$' -bench Produce -benchtime 500000x -emit.codec none
func BenchmarkProduce(b *testing.B) {
	if b.N < 10_000 {
		return // the framework's probe run
	}
	codecs := map[string]kafka.Compression{"snappy": kafka.Snappy, "lz4": kafka.Lz4, "zstd": kafka.Zstd, "gzip": kafka.Gzip}
	codec, ok := codecs[*produceCodec]
	if !ok && *produceCodec != "none" {
		b.Fatalf("-emit.codec %q", *produceCodec)
	}
	bin := filepath.Join(b.TempDir(), "kafka-dev")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/kafka-dev").CombinedOutput(); err != nil {
		b.Fatalf("build kafka-dev: %v\n%s", err, out)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(b))
	broker := exec.Command(bin)
	broker.Env = append(os.Environ(), "KAFKA_DEV_ADDR="+addr, "KAFKA_TOPIC=decisions", "KAFKA_DEV_PARTITIONS=4")
	broker.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := broker.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { broker.Process.Kill(); broker.Wait() }()
	for deadline := time.Now().Add(testenv.Timeout(30 * time.Second)); ; {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("kafka-dev did not listen")
		}
		time.Sleep(50 * time.Millisecond)
	}

	cfg := kafkaemit.Config{Brokers: []string{addr}, Topic: "decisions", BatchSize: *produceBatch, Compression: codec,
		NoCompression: *produceCodec == "none", Buffer: 1 << 17, FlushTimeout: time.Minute,
		Logger: slog.New(slog.NewJSONHandler(io.Discard, nil)), Registry: prometheus.NewRegistry()}
	if *produceSpool {
		sp, err := spool.Open(spool.Config{Dir: b.TempDir()})
		if err != nil {
			b.Fatal(err)
		}
		cfg.Spool = sp
	}
	e, err := kafkaemit.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() { cancel(); <-done }()

	// Warm up: connections, metadata, the first batches.
	evs := make([]metering.Event, 4096)
	ids := metering.NewIDs()
	now := time.Now()
	for i := range evs {
		evs[i] = metering.Event{EventID: ids.Next(now), TS: now.UnixMilli(), Key: fmt.Sprintf("acct_%04d", i%1000),
			Scope: []string{"api:search", "api:read", "api:write"}[i%3], Tier: "pro", Cost: 1, Allowed: i%10 != 0,
			Source: "shared", Remaining: 10, Limit: 100, Policy: "pro", Instance: "bench", DecidedUS: now.UnixMicro()}
	}
	for i := 0; i < 20_000; i++ {
		e.Emit(evs[i%len(evs)])
	}
	for e.Sent() < 20_000 {
		time.Sleep(time.Millisecond)
	}

	sent0 := e.Sent()
	cpu0 := proccpu.Self()
	bcpu0, _ := proccpu.Of(broker.Process.Pid)
	start := time.Now()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for uint64(i)-(e.Sent()-sent0) > 1<<16 {
			time.Sleep(time.Millisecond)
		}
		e.Emit(evs[i%len(evs)])
	}
	for e.Sent()-sent0 < uint64(b.N) && e.Dropped() == 0 {
		time.Sleep(time.Millisecond)
	}
	b.StopTimer()
	elapsed := time.Since(start)
	cpu := proccpu.Self() - cpu0
	bcpu, _ := proccpu.Of(broker.Process.Pid)
	bcpu -= bcpu0
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "emitter-cpu-ns/event")
	b.ReportMetric(float64(bcpu.Nanoseconds())/float64(b.N), "broker-cpu-ns/event")
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(e.Dropped()), "dropped")
}
