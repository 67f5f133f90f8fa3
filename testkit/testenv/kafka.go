package testenv

import (
	"testing"

	"github.com/ratewarden/ratewarden/testkit/kafkadev"
)

// Kafka is an in-process Kafka-protocol broker (kfake) on a free loopback
// port with the decisions topic created.
type Kafka = kafkadev.Broker

// StartKafka starts a broker with topic (partitions partitions) for the test
// and stops it at cleanup.
func StartKafka(tb testing.TB, topic string, partitions int) *Kafka {
	tb.Helper()
	SkipShort(tb)
	k, err := NewKafka(topic, partitions)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(k.Close)
	return k
}

// NewKafka starts a broker on a free port; the caller must Close it. It is
// for TestMain, benchmarks and tools; tests use StartKafka.
func NewKafka(topic string, partitions int) (*Kafka, error) {
	return kafkadev.Start(kafkadev.Config{Topic: topic, Partitions: partitions})
}

// NewKafkaWith starts a broker with cfg (Port 0 = a free port); the caller
// must Close it.
func NewKafkaWith(cfg kafkadev.Config) (*Kafka, error) { return kafkadev.Start(cfg) }
