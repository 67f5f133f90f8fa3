// Package kafkadev runs an in-process Kafka-protocol broker
// (github.com/twmb/franz-go/pkg/kfake) with the decisions topic created: the
// broker of `make up` (cmd/kafka-dev, fixed port) and of the tests
// (testkit/testenv, free ports). It is for development and tests only: kfake
// keeps everything in memory, or, with Config.DataDir, also on disk so that
// a restarted broker has its topics back.
package kafkadev

import (
	"crypto/tls"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ratewarden/ratewarden/metering"
)

// Config says where the broker listens and what it holds. The zero value
// listens on a random loopback port with topic ratelimit.decisions of 4
// partitions.
type Config struct {
	Port       int    // loopback port; 0 = any free port
	Topic      string // created at start; default metering.DefaultTopic
	Partitions int    // of Topic; default 4
	// MinSessionTimeout is the shortest consumer-group session the broker
	// accepts; default 1 s (kfake's own default, 6 s, slows crash tests).
	MinSessionTimeout time.Duration
	// RetentionBytes bounds each partition's log (kfake holds it in
	// memory): older batches are dropped every 5 s. Default 256 MiB;
	// negative = unbounded.
	RetentionBytes int64
	// Users switches SASL on (kfake's EnableSASL): every connection must
	// authenticate as one of them before anything else. Each is a kfake
	// superuser (no ACLs apply). Empty = no authentication.
	Users []User
	// TLS, when set, makes the listener TLS-only with this server
	// configuration (kfake's TLS option).
	TLS *tls.Config
	// DataDir, when set, is where the broker keeps its topics, offsets
	// and groups (kfake's DataDir): a broker started again on it has them
	// back. Empty = in memory only.
	DataDir string
}

// User is a SASL user of the broker. Mechanism is PLAIN, SCRAM-SHA-256 or
// SCRAM-SHA-512 (Kafka's spelling; lower case is accepted).
type User struct {
	Mechanism string
	Name      string
	Password  string
}

// String leaves the password out.
func (u User) String() string { return u.Mechanism + ":" + u.Name }

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
		cfg.Topic = metering.DefaultTopic
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
	if len(cfg.Users) > 0 {
		opts = append(opts, kfake.EnableSASL())
		for _, u := range cfg.Users {
			m := strings.ToUpper(u.Mechanism)
			if m != "PLAIN" && m != "SCRAM-SHA-256" && m != "SCRAM-SHA-512" {
				return nil, fmt.Errorf("kafkadev: user %s: mechanism %q is not PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", u.Name, u.Mechanism)
			}
			if u.Name == "" || u.Password == "" {
				return nil, fmt.Errorf("kafkadev: a %s user needs a name and a password", m)
			}
			opts = append(opts, kfake.Superuser(m, u.Name, u.Password))
		}
	}
	if cfg.TLS != nil {
		opts = append(opts, kfake.TLS(cfg.TLS))
	}
	if cfg.DataDir != "" {
		opts = append(opts, kfake.DataDir(cfg.DataDir))
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

// Close stops the broker; its data is gone unless it has a DataDir. Safe
// to call more than once.
func (b *Broker) Close() {
	b.once.Do(func() {
		close(b.stop)
		<-b.done
		b.cluster.Close()
	})
}

// SlowFetches makes the broker answer every Fetch request at least d after
// it arrives, as an overloaded broker or machine does (the consumer's
// network deadline must allow for it), until the returned restore is called.
// For tests.
func (b *Broker) SlowFetches(d time.Duration) (restore func()) {
	return b.controlFetches(func(*kmsg.FetchRequest) bool { return true }, func(stop <-chan struct{}) {
		select {
		case <-time.After(d):
		case <-stop:
		}
	})
}

// HoldFetches makes the broker hold every Fetch request that asks for
// partition of the topic, without an answer, until the returned release is
// called: the partition's consumers see no records, no error and no end of
// their wait (a stalled partition). Other partitions are served normally as
// long as their fetches travel on other connections. For tests.
func (b *Broker) HoldFetches(partition int32) (release func()) {
	return b.controlFetches(func(req *kmsg.FetchRequest) bool {
		for _, t := range req.Topics {
			if t.Topic != b.topic && t.Topic != "" { // "" = addressed by topic ID (v13+)
				continue
			}
			if slices.ContainsFunc(t.Partitions, func(p kmsg.FetchRequestTopicPartition) bool { return p.Partition == partition }) {
				return true
			}
		}
		return false
	}, func(stop <-chan struct{}) { <-stop })
}

// HoldProduces makes the broker hold every Produce request, unanswered
// (and not yet applied), until the returned release is called, as a
// frozen broker (SIGSTOP, a stalled disk) does: a producer's writes time
// out, and the held ones are applied when it thaws. For tests.
func (b *Broker) HoldProduces() (release func()) {
	stop := make(chan struct{})
	var stopped atomic.Bool
	b.cluster.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		if stopped.Load() {
			b.cluster.DropControl()
			return nil, nil, false
		}
		b.cluster.SleepControl(func() { <-stop })
		return nil, nil, false
	})
	var once sync.Once
	return func() {
		once.Do(func() {
			stopped.Store(true)
			close(stop)
		})
	}
}

// controlFetches runs wait (in kfake's sleep, which lets the broker serve
// other connections meanwhile) before kfake handles each Fetch request that
// match selects, until the returned function is called; that wakes every
// held request and removes the control at the next Fetch.
func (b *Broker) controlFetches(match func(*kmsg.FetchRequest) bool, wait func(stop <-chan struct{})) func() {
	stop := make(chan struct{})
	var stopped atomic.Bool
	b.cluster.ControlKey(int16(kmsg.Fetch), func(req kmsg.Request) (kmsg.Response, error, bool) {
		if stopped.Load() {
			b.cluster.DropControl()
			return nil, nil, false
		}
		if fr, ok := req.(*kmsg.FetchRequest); ok && match(fr) {
			b.cluster.SleepControl(func() { wait(stop) })
		}
		return nil, nil, false // not handled: kfake answers the request itself
	})
	var once sync.Once
	return func() {
		once.Do(func() {
			stopped.Store(true)
			close(stop)
		})
	}
}
