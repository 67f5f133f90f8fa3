// Package kafkapub publishes billing's correction events on the decisions
// topic with kafka-go, partitioned as the limiters' emitter partitions
// (kafka.Hash of the key), so that a correction published again lands in
// the partition of its first copy, where the consumer's deduplication
// finds it.
package kafkapub

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/billing"
)

// Config configures a Publisher.
type Config struct {
	Brokers []string // required
	Topic   string   // "" = metering.DefaultTopic
	// Transport reaches the brokers (TLS, SASL); nil = plain TCP with a
	// 5 s dial timeout.
	Transport *kafka.Transport
}

// Publisher writes events synchronously, each acknowledged by every
// in-sync replica. Safe for concurrent use; Close releases it.
type Publisher struct{ w *kafka.Writer }

var _ billing.Publisher = (*Publisher)(nil)

// New builds a Publisher; it connects on the first Publish.
func New(cfg Config) (*Publisher, error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("kafkapub: Config.Brokers is required")
	}
	if cfg.Topic == "" {
		cfg.Topic = metering.DefaultTopic
	}
	tr := cfg.Transport
	if tr == nil {
		tr = &kafka.Transport{DialTimeout: 5 * time.Second, ClientID: "usage-api-billing"}
	}
	return &Publisher{w: &kafka.Writer{Addr: kafka.TCP(cfg.Brokers...), Topic: cfg.Topic, Transport: tr,
		Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll, BatchSize: 1000, BatchTimeout: 10 * time.Millisecond,
		MaxAttempts: 5, WriteTimeout: 10 * time.Second}}, nil
}

// Publish writes evs (keyed by their key) and returns once the log has
// every one, or the first error; ctx bounds it.
func (p *Publisher) Publish(ctx context.Context, evs []metering.Event) error {
	msgs := make([]kafka.Message, len(evs))
	for i := range evs {
		b, err := evs[i].Encode()
		if err != nil {
			return fmt.Errorf("kafkapub: encode: %w", err)
		}
		msgs[i] = kafka.Message{Key: []byte(evs[i].Key), Value: b}
	}
	for len(msgs) > 0 {
		n := min(len(msgs), 1000)
		if err := p.w.WriteMessages(ctx, msgs[:n]...); err != nil {
			return fmt.Errorf("kafkapub: publish %d correction events: %w: %v", n, billing.ErrUnavailable, err)
		}
		msgs = msgs[n:]
	}
	return nil
}

// Close flushes nothing (writes are synchronous) and releases the writer.
func (p *Publisher) Close() error { return p.w.Close() }
