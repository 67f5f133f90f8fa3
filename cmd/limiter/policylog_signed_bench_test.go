package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/ratewarden/ratewarden/internal/kafkaconn"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/policylog/kafkalog"
	"github.com/ratewarden/ratewarden/testkit/kafkadev"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// benchKeys is a writer's key and the keyring that trusts it.
func benchKeys(b *testing.B) (*policylog.Signer, *policylog.Keyring) {
	b.Helper()
	s, err := policylog.GenerateSigner()
	if err != nil {
		b.Fatal(err)
	}
	k, err := policylog.ParseKeyring(strings.NewReader(s.KeyringLine("bench")))
	if err != nil {
		b.Fatal(err)
	}
	return s, k
}

// BenchmarkTailStartSignedOverrides is BenchmarkTailStartOverrides with
// every record signed and the limiter checking each signature against
// POLICY_TRUSTED_KEYS_FILE's keyring. Each iteration is a first start
// (an empty POLICY_CACHE_DIR: every signature checked; reported as
// fresh-s/start and fresh-cpu-s/start), then a start again from the cache
// it wrote (the checks it remembers spared: s/start, cpu-s/start and the
// live heap per override).
func BenchmarkTailStartSignedOverrides(b *testing.B) {
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
	signer, ring := benchKeys(b)
	w := policylog.NewClient(l, false)
	policylog.Keys{Signer: signer, Ring: ring}.Use(w)
	if _, err := w.Push(ctx, logDocA, "", "first", policylog.NoExpect); err != nil {
		b.Fatal(err)
	}
	fillSignedOverrides(b, k.Addr(), signer, startOverrides)
	if os.Getenv("BENCH_NO_CHECKPOINT") == "" {
		// What `limiter policy checkpoint` writes (writers write one every
		// policylog.DefaultCheckpointEvery records): its writer checks
		// every signature once, outside the measure.
		cw := policylog.NewClient(l, false)
		policylog.Keys{Signer: signer, Ring: ring}.Use(cw)
		if _, err := cw.Checkpoint(ctx, "", "bench"); err != nil {
			b.Fatal(err)
		}
	}
	cfg := config{
		KafkaBrokers: []string{k.Addr()}, Kafka: &kafkaconn.Security{},
		PolicyLog: policyLogConfig{Source: sourceKafka, Topic: kafkalog.DefaultTopic, StartWait: 10 * time.Minute, Keys: ring},
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	b.ResetTimer()
	for range b.N {
		// First with an empty cache (every signature checked), then again
		// from the cache that start wrote (checks it vouches for skipped).
		cfg.PolicyLog.CacheDir = b.TempDir()
		measureStart(b, ctx, cfg, logger, "fresh-")
		runtime.GC()
		measureStart(b, ctx, cfg, logger, "")
	}
}

// fillSignedOverrides is fillOverrides with every record signed by s
// (signed on every CPU: a signature costs more than the rest).
func fillSignedOverrides(b *testing.B, addr string, s *policylog.Signer, n int) {
	b.Helper()
	cl := &kafka.Client{Addr: kafka.TCP(addr), Timeout: time.Minute}
	const batch = 5000
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for from := 0; from < n; from += batch {
		recs := make([]kafka.Record, min(batch, n-from))
		var wg sync.WaitGroup
		workers := runtime.GOMAXPROCS(0)
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := w; j < len(recs); j += workers {
					i := from + j
					o := &policy.Override{Tier: "pro", Reason: "negotiated deal"}
					if i%2 == 1 {
						o = &policy.Override{Rate: 50, Burst: 100, Reason: "negotiated deal"}
					}
					scope := ""
					if i%4 == 3 {
						scope = "api:search"
					}
					r := policylog.Record{Revision: int64(i + 2), Parent: int64(i + 1), Kind: policylog.KindOverride,
						Message: "negotiated deal", Time: t0.Add(time.Duration(i) * time.Millisecond),
						Key: fmt.Sprintf("acct_%07d", i), Scope: scope, Override: o}
					r.Seal()
					v, err := s.Encode(&r)
					if err != nil {
						panic(err)
					}
					recs[j] = kafka.Record{Key: kafka.NewBytes([]byte(r.LogKey())), Value: kafka.NewBytes(v), Time: r.Time}
				}
			}()
		}
		wg.Wait()
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
	}
}

// BenchmarkPushToFleetSigned is BenchmarkPushToFleet with signed pushes
// and limiters that check every signature.
func BenchmarkPushToFleetSigned(b *testing.B) {
	k, err := testenv.NewKafka("ratelimit.decisions", 1)
	if err != nil {
		b.Fatal(err)
	}
	defer k.Close()
	l, err := kafkalog.New(kafkalog.Config{Brokers: []string{k.Addr()}, Security: &kafkaconn.Security{}, Wait: 100 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	if err := l.Ensure(ctx); err != nil {
		b.Fatal(err)
	}
	signer, ring := benchKeys(b)
	w := policylog.NewClient(l, true)
	policylog.Keys{Signer: signer, Ring: ring}.Use(w)
	if _, err := w.Push(ctx, logDocA, "", "first", policylog.NoExpect); err != nil {
		b.Fatal(err)
	}
	keys := filepath.Join(b.TempDir(), "keyring")
	if err := os.WriteFile(keys, []byte(signer.KeyringLine("bench")+"\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	var fleet []*limiterProc
	for i := range 3 {
		fleet = append(fleet, startLimiter(b, logBootstrap, "KAFKA_BROKERS="+k.Addr(), "POLICY_SOURCE=kafka",
			"POLICY_TRUSTED_KEYS_FILE="+keys, fmt.Sprintf("LIMITER_INSTANCE_ID=b%d", i), "LIMITER_GRPC_ADDR="))
	}
	b.ResetTimer()
	const pushes = 100
	for range b.N {
		var lat []time.Duration
		for i := range pushes {
			o, err := w.Push(ctx, logDocA+fmt.Sprintf("# push %d\n", i), "", "push", policylog.NoExpect)
			if err != nil {
				b.Fatal(err)
			}
			done := time.Now()
			for _, p := range fleet {
				for deadline := time.Now().Add(testenv.Timeout(30 * time.Second)); ; {
					if pol := p.policyOf(b); pol["revision"] == float64(o.Head) {
						if pol["author"] != "bench" {
							b.Fatalf("%s: author %v", p.url, pol["author"])
						}
						break
					}
					if time.Now().After(deadline) {
						b.Fatalf("%s never reached revision %d", p.url, o.Head)
					}
					time.Sleep(2 * time.Millisecond)
				}
			}
			lat = append(lat, time.Since(done))
		}
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(lat[(len(lat)*99+99)/100-1].Microseconds())/1000, "p99-ms")
		b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
	}
}
