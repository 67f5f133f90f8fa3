package kafkadev_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/ratewarden/ratewarden/internal/kafkadev"
)

func TestBrokerServesTopicAndGroups(t *testing.T) {
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
	total := 0
	for _, pa := range gen.Assignments["t.decisions"] {
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{b.Addr()}, Topic: "t.decisions", Partition: pa.ID, MaxWait: 100 * time.Millisecond})
		r.SetOffset(0)
		for {
			rctx, rc := context.WithTimeout(ctx, 500*time.Millisecond)
			_, err := r.ReadMessage(rctx)
			rc()
			if err != nil {
				break
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
