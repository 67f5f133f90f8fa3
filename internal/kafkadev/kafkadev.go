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
}

// Broker is a running kfake cluster of one broker.
type Broker struct {
	cluster *kfake.Cluster
	addr    string
	topic   string
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
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.SeedTopics(int32(cfg.Partitions), cfg.Topic),
		kfake.DefaultNumPartitions(cfg.Partitions),
		kfake.AllowAutoTopicCreation(),
		kfake.GroupMinSessionTimeout(cfg.MinSessionTimeout),
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
	return &Broker{cluster: c, addr: addrs[0], topic: cfg.Topic}, nil
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
func (b *Broker) Close() { b.cluster.Close() }
