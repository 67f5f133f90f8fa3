package kafkadev_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/ratewarden/ratewarden/testkit/kafkadev"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

func TestBrokerServesTopicAndGroups(t *testing.T) {
	testenv.SkipShort(t) // starts a broker
	b, err := kafkadev.Start(kafkadev.Config{Topic: "t.decisions", Partitions: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	conn, err := kafka.DialContext(ctx, "tcp", b.Addr())
	if err != nil {
		t.Fatal(err)
	}
	parts, err := conn.ReadPartitions("t.decisions")
	conn.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(parts) != 3 {
		t.Fatalf("topic has %d partitions, want 3", len(parts))
	}

	w := &kafka.Writer{Addr: kafka.TCP(b.Addr()), Topic: "t.decisions", Balancer: &kafka.Hash{}, BatchTimeout: time.Millisecond}
	var msgs []kafka.Message
	for i := 0; i < 30; i++ {
		msgs = append(msgs, kafka.Message{Key: []byte(fmt.Sprint("k", i)), Value: []byte("v")})
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	w.Close()

	g, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID: "meter", Brokers: []string{b.Addr()}, Topics: []string{"t.decisions"},
		SessionTimeout: 2 * time.Second, HeartbeatInterval: 500 * time.Millisecond,
		RebalanceTimeout: 2 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	gen, err := g.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Each partition is read up to its end offset, not until a silence: a
	// pause of a loaded machine is not the end of a partition.
	total := 0
	for _, pa := range gen.Assignments["t.decisions"] {
		conn, err := kafka.DialLeader(ctx, "tcp", b.Addr(), "t.decisions", pa.ID)
		if err != nil {
			t.Fatal(err)
		}
		last, err := conn.ReadLastOffset()
		conn.Close()
		if err != nil {
			t.Fatal(err)
		}
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{b.Addr()}, Topic: "t.decisions", Partition: pa.ID, MaxWait: time.Second})
		for off := int64(0); off < last; off++ {
			if _, err := r.ReadMessage(ctx); err != nil {
				t.Fatalf("partition %d: read offset %d of %d: %v", pa.ID, off, last, err)
			}
			total++
		}
		r.Close()
	}
	if total != 30 || len(gen.Assignments["t.decisions"]) != 3 {
		t.Fatalf("read %d messages from %d partitions, want 30 from 3", total, len(gen.Assignments["t.decisions"]))
	}
}

func TestRetentionBoundsThePartitionLog(t *testing.T) {
	testenv.SkipShort(t) // starts a broker
	b, err := kafkadev.Start(kafkadev.Config{Topic: "t", Partitions: 1, RetentionBytes: 256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w := &kafka.Writer{Addr: kafka.TCP(b.Addr()), Topic: "t", BatchSize: 100, BatchTimeout: time.Millisecond}
	defer w.Close()
	value := make([]byte, 10<<10)
	for i := 0; i < 10; i++ { // 10 batches of 100 × 10 KiB = 10 MiB
		msgs := make([]kafka.Message, 100)
		for j := range msgs {
			msgs[j] = kafka.Message{Value: value}
		}
		if err := w.WriteMessages(ctx, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := kafka.DialLeader(ctx, "tcp", b.Addr(), "t", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for {
		first, err := conn.ReadFirstOffset()
		if err != nil {
			t.Fatal(err)
		}
		if first > 0 {
			return
		}
		if ctx.Err() != nil {
			t.Fatal("log start offset still 0: retention never applied")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// HoldFetches leaves the fetches of one partition unanswered until release,
// and serves the others; SlowFetches delays every answer.
func TestFetchFaults(t *testing.T) {
	testenv.SkipShort(t) // starts a broker
	b, err := kafkadev.Start(kafkadev.Config{Topic: "t", Partitions: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	w := &kafka.Writer{Addr: kafka.TCP(b.Addr()), Topic: "t", Balancer: &kafka.RoundRobin{}, BatchTimeout: time.Millisecond}
	if err := w.WriteMessages(ctx, kafka.Message{Value: []byte("a")}, kafka.Message{Value: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	// One client (and connection pool) per partition: kfake answers the
	// requests of one connection in order, so a held fetch holds its
	// connection.
	fetch := func(ctx context.Context, p int) (*kafka.FetchResponse, error) {
		tr := &kafka.Transport{}
		defer tr.CloseIdleConnections()
		c := &kafka.Client{Addr: kafka.TCP(b.Addr()), Transport: tr}
		return c.Fetch(ctx, &kafka.FetchRequest{Topic: "t", Partition: p, Offset: 0, MinBytes: 1, MaxBytes: 1 << 20, MaxWait: 100 * time.Millisecond})
	}

	release := b.HoldFetches(1)
	if _, err := fetch(ctx, 0); err != nil {
		t.Fatalf("partition 0 while partition 1 is held: %v", err)
	}
	// How long a held fetch is left unanswered is the test's choice; any
	// wait shows it is not answered (the client gives up with its
	// context's deadline, or the socket's, which is the same).
	hctx, hcancel := context.WithTimeout(ctx, 2*time.Second)
	resp, err := fetch(hctx, 1)
	hcancel()
	if err == nil {
		t.Fatalf("held partition 1 answered: %+v", resp)
	}
	release()
	if resp, err := fetch(ctx, 1); err != nil || resp.Error != nil {
		t.Fatalf("partition 1 after release: %v %v", err, resp)
	}

	restore := b.SlowFetches(300 * time.Millisecond)
	start := time.Now()
	if _, err := fetch(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("a slowed fetch was answered after %s, want at least 300ms", d)
	}
	restore()
}

// TestDataDirKeepsTopics: a broker started again on the same DataDir (and
// the same port) has its topics, their records and their configuration
// back.
func TestDataDirKeepsTopics(t *testing.T) {
	dir := t.TempDir()
	b, err := kafkadev.Start(kafkadev.Config{Topic: "t.decisions", Partitions: 2, DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	port := b.Port()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.Cluster().CreateTopic("t.policy", 1, map[string]string{"cleanup.policy": "compact"}); err != nil {
		t.Fatal(err)
	}
	cl := &kafka.Client{Addr: kafka.TCP(b.Addr()), Timeout: 10 * time.Second}
	res, err := cl.Produce(ctx, &kafka.ProduceRequest{Topic: "t.policy", Partition: 0, RequiredAcks: kafka.RequireAll,
		Records: kafka.NewRecordReader(kafka.Record{Key: kafka.NewBytes([]byte("policy")), Value: kafka.NewBytes([]byte("revision 1"))})})
	if err != nil || res.Error != nil {
		t.Fatalf("produce: %v %v", err, res)
	}
	b.Close()

	b, err = kafkadev.Start(kafkadev.Config{Port: port, Topic: "t.decisions", Partitions: 2, DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// A transport of its own: the default one pools connections to the
	// broker that was closed, at the same address.
	cl = &kafka.Client{Addr: kafka.TCP(b.Addr()), Timeout: 10 * time.Second, Transport: &kafka.Transport{}}
	f, err := cl.Fetch(ctx, &kafka.FetchRequest{Topic: "t.policy", Partition: 0, Offset: 0, MinBytes: 1, MaxBytes: 1 << 20, MaxWait: 100 * time.Millisecond})
	if err != nil || f.Error != nil {
		t.Fatalf("fetch after the restart: %v %v", err, f)
	}
	r, err := f.Records.ReadRecord()
	if err != nil {
		t.Fatalf("no record after the restart: %v (high watermark %d)", err, f.HighWatermark)
	}
	v := make([]byte, 32)
	n, _ := r.Value.Read(v)
	if string(v[:n]) != "revision 1" || r.Offset != 0 {
		t.Fatalf("after the restart: offset %d value %q", r.Offset, v[:n])
	}
	cfg, err := cl.DescribeConfigs(ctx, &kafka.DescribeConfigsRequest{Resources: []kafka.DescribeConfigRequestResource{{
		ResourceType: kafka.ResourceTypeTopic, ResourceName: "t.policy", ConfigNames: []string{"cleanup.policy"}}}})
	if err != nil || len(cfg.Resources) != 1 || len(cfg.Resources[0].ConfigEntries) != 1 || cfg.Resources[0].ConfigEntries[0].ConfigValue != "compact" {
		t.Fatalf("configuration after the restart: %+v %v", cfg, err)
	}
}
