// Package kafkadev runs an in-process Kafka-protocol broker
// (github.com/twmb/franz-go/pkg/kfake) with the decisions topic created: the
// broker of `make up` (cmd/kafka-dev, fixed port) and of the tests
// (internal/testenv, free ports). It is for development and tests only: kfake
// keeps everything in memory.
package kafkadev

import (
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// Config says where the broker listens and what it holds. The zero value
// listens on a random loopback port with topic ratelimit.decisions of 4
// partitions.
type Config struct {
	Port       int    // loopback port; 0 = any free port
	Topic      string // created at start; default ratelimit.decisions
	Partitions int    // of Topic; default 4
	// MinSessionTimeout is the shortest consumer-group session the broker
	// accepts; default 1 s (kfake's own default, 6 s, slows crash tests).
	MinSessionTimeout time.Duration
	// RetentionBytes bounds each partition's log (kfake holds it in
	// memory): older batches are dropped every 5 s. Default 256 MiB;
	// negative = unbounded.
	RetentionBytes int64
}

// Broker is a running kfake cluster of one broker.
type Broker struct {
	cluster *kfake.Cluster
	addr    string
	topic   string
	once    sync.Once
	stop    chan struct{} // closed by Close
	done    chan struct{} // closed when the retention goroutine has exited
}

// Start starts the broker and creates the topic.
func Start(cfg Config) (*Broker, error) {
	if cfg.Topic == "" {
		cfg.Topic = "ratelimit.decisions"
	}
	if cfg.Partitions <= 0 {
		cfg.Partitions = 4
	}
	if cfg.MinSessionTimeout <= 0 {
		cfg.MinSessionTimeout = time.Second
	}
	if cfg.RetentionBytes == 0 {
		cfg.RetentionBytes = 256 << 20
	}
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.SeedTopics(int32(cfg.Partitions), cfg.Topic),
		kfake.DefaultNumPartitions(cfg.Partitions),
		kfake.AllowAutoTopicCreation(),
		kfake.GroupMinSessionTimeout(cfg.MinSessionTimeout),
		kfake.BrokerConfigs(map[string]string{"log.retention.bytes": strconv.FormatInt(cfg.RetentionBytes, 10)}),
	}
	if cfg.Port != 0 {
		opts = append(opts, kfake.Ports(cfg.Port))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafkadev: start broker on port %d: %w", cfg.Port, err)
	}
	addrs := c.ListenAddrs()
	if len(addrs) != 1 {
		c.Close()
		return nil, fmt.Errorf("kafkadev: broker listens on %v, want one address", addrs)
	}
	b := &Broker{cluster: c, addr: addrs[0], topic: cfg.Topic, stop: make(chan struct{}), done: make(chan struct{})}
	go b.retain(cfg.RetentionBytes > 0)
	return b, nil
}

// retain applies the retention limit every 5 s until Close.
func (b *Broker) retain(enabled bool) {
	defer close(b.done)
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
			if enabled {
				b.cluster.ApplyRetention()
			}
		}
	}
}

// Addr is the broker's host:port (loopback).
func (b *Broker) Addr() string { return b.addr }

// Port is the broker's port.
func (b *Broker) Port() int {
	_, p, _ := net.SplitHostPort(b.addr)
	n, _ := strconv.Atoi(p)
	return n
}

// Topic is the topic created at start.
func (b *Broker) Topic() string { return b.topic }

// Cluster is the underlying kfake cluster (for fault injection in tests).
func (b *Broker) Cluster() *kfake.Cluster { return b.cluster }

// Close stops the broker; its data is gone. Safe to call more than once.
func (b *Broker) Close() {
	b.once.Do(func() {
		close(b.stop)
		<-b.done
		b.cluster.Close()
	})
}
