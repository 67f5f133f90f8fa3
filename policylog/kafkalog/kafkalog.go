// Package kafkalog is the policy log on Kafka (kafka-go): one topic of one
// partition, so that every record has one place in one total order,
// created compacted when missing.
package kafkalog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"

	"github.com/ratewarden/ratewarden/internal/kafkaconn"
	"github.com/ratewarden/ratewarden/policylog"
)

// DefaultTopic is POLICY_TOPIC's default.
const DefaultTopic = "ratelimit.policy"

// Config says where the log is. Zero durations take the defaults.
type Config struct {
	Brokers  []string            // required
	Topic    string              // default DefaultTopic
	Security *kafkaconn.Security // required (the environment's KAFKA_SASL_*, KAFKA_TLS*)
	ClientID string              // default "ratewarden-policy"
	// Timeout bounds every request (default 10 s); Wait is how long a
	// Fetch waits at the broker for new records (default 500 ms).
	Timeout time.Duration
	Wait    time.Duration
}

// Log is the policy log on Kafka. Safe for concurrent use.
type Log struct {
	cfg  Config
	conn atomic.Pointer[conn]
}

// conn is a kafka-go client and its transport, which caches the cluster's
// metadata for MetadataTTL and answers metadata requests from that cache.
type conn struct {
	client    *kafka.Client
	transport *kafka.Transport
}

var _ policylog.Log = (*Log)(nil)

// New returns the log; it connects on first use.
func New(cfg Config) (*Log, error) {
	if len(cfg.Brokers) == 0 || cfg.Security == nil {
		return nil, errors.New("kafkalog: Brokers and Security are required")
	}
	if cfg.Topic == "" {
		cfg.Topic = DefaultTopic
	}
	if cfg.ClientID == "" {
		cfg.ClientID = "ratewarden-policy"
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.Wait <= 0 {
		cfg.Wait = 500 * time.Millisecond
	}
	l := &Log{cfg: cfg}
	l.conn.Store(l.dial())
	return l, nil
}

// dial is a new client, whose transport reads the metadata afresh on
// first use.
func (l *Log) dial() *conn {
	tr := l.cfg.Security.Transport(l.cfg.ClientID, l.cfg.Timeout)
	tr.MetadataTTL = 5 * time.Second
	return &conn{transport: tr, client: &kafka.Client{Addr: kafka.TCP(l.cfg.Brokers...), Timeout: l.cfg.Timeout, Transport: tr}}
}

// client is the current client.
func (l *Log) client() *kafka.Client { return l.conn.Load().client }

// missing is called when the topic was found missing: the next call
// gets a new transport, so that a topic a writer creates meanwhile is
// seen at once, not when the cached metadata expires (MetadataTTL). A
// follower started before the first push asks again every few hundred
// milliseconds (policylog.MissingTopicRetry) and must see the topic at
// its next question.
func (l *Log) missing() {
	if old := l.conn.Swap(l.dial()); old != nil {
		old.transport.CloseIdleConnections()
	}
}

// Topic is the log's topic.
func (l *Log) Topic() string { return l.cfg.Topic }

// Close releases the connections.
func (l *Log) Close() { l.conn.Load().transport.CloseIdleConnections() }

// topicConfigs are the configurations a policy topic is created with,
// and the ones CheckIntegrity requires: compaction only, and retention
// that never deletes (a record removed by retention is an override lost
// without a word; some brokers apply retention to compacted topics too).
var topicConfigs = map[string]string{
	"cleanup.policy":  "compact",
	"retention.ms":    "-1",
	"retention.bytes": "-1",
}

// Ensure creates the topic when it is missing: one partition,
// cleanup.policy=compact, unbounded retention (topicConfigs), and room
// for a document of policy.MaxFileSize. An existing topic of more than one partition is an
// error (the log has no total order across partitions).
func (l *Log) Ensure(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	defer cancel()
	res, err := l.client().CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: l.cfg.Topic, NumPartitions: 1, ReplicationFactor: -1,
		ConfigEntries: []kafka.ConfigEntry{
			{ConfigName: "cleanup.policy", ConfigValue: topicConfigs["cleanup.policy"]},
			{ConfigName: "retention.ms", ConfigValue: topicConfigs["retention.ms"]},
			{ConfigName: "retention.bytes", ConfigValue: topicConfigs["retention.bytes"]},
			{ConfigName: "max.message.bytes", ConfigValue: fmt.Sprint(policylog.MaxRecord + 1<<20)},
		},
	}}})
	if err != nil {
		return fmt.Errorf("create topic %s: %w", l.cfg.Topic, err)
	}
	if err := res.Errors[l.cfg.Topic]; err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
		return fmt.Errorf("create topic %s: %w", l.cfg.Topic, err)
	}
	md, err := l.client().Metadata(ctx, &kafka.MetadataRequest{Topics: []string{l.cfg.Topic}})
	if err != nil {
		return fmt.Errorf("metadata of %s: %w", l.cfg.Topic, err)
	}
	for _, t := range md.Topics {
		if t.Name != l.cfg.Topic {
			continue
		}
		if t.Error != nil {
			return fmt.Errorf("topic %s: %w", l.cfg.Topic, t.Error)
		}
		if len(t.Partitions) != 1 {
			return fmt.Errorf("topic %s has %d partitions; the policy log needs exactly one (a total order)", l.cfg.Topic, len(t.Partitions))
		}
		return nil
	}
	return fmt.Errorf("topic %s: not in the broker's metadata", l.cfg.Topic)
}

// Append writes one record to partition 0, acknowledged by every in-sync
// replica, and returns its offset.
func (l *Log) Append(ctx context.Context, key string, value []byte) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	defer cancel()
	rec := kafka.Record{Key: kafka.NewBytes([]byte(key)), Time: time.Now()}
	if value != nil {
		rec.Value = kafka.NewBytes(value)
	}
	res, err := l.client().Produce(ctx, &kafka.ProduceRequest{
		Topic: l.cfg.Topic, Partition: 0, RequiredAcks: kafka.RequireAll,
		Records: kafka.NewRecordReader(rec),
	})
	if err != nil {
		return 0, err
	}
	if res.Error != nil {
		return 0, res.Error
	}
	return res.BaseOffset, nil
}

// Fetch reads from offset from on, waiting up to Wait for a first record.
// An offset before the log's start (records removed by retention) reads
// from the start.
func (l *Log) Fetch(ctx context.Context, from int64) ([]policylog.Entry, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout+l.cfg.Wait)
	defer cancel()
	res, err := l.client().Fetch(ctx, &kafka.FetchRequest{
		Topic: l.cfg.Topic, Partition: 0, Offset: from,
		MinBytes: 1, MaxBytes: 16 << 20, MaxWait: l.cfg.Wait,
	})
	if err == nil && errors.Is(res.Error, kafka.OffsetOutOfRange) {
		// Before the start: read from the first offset there is. (After
		// the end cannot happen to a reader that only moves forward.)
		var first int64
		if first, err = l.FirstOffset(ctx); err == nil {
			res, err = l.client().Fetch(ctx, &kafka.FetchRequest{
				Topic: l.cfg.Topic, Partition: 0, Offset: first,
				MinBytes: 1, MaxBytes: 16 << 20, MaxWait: l.cfg.Wait,
			})
		}
	}
	if err == nil {
		err = res.Error
	}
	if IsNoTopic(err) {
		l.missing()
		return nil, 0, fmt.Errorf("%w: %s (check POLICY_TOPIC; nothing was created)", ErrNoTopic, l.cfg.Topic)
	}
	if err != nil {
		return nil, 0, err
	}
	var out []policylog.Entry
	for {
		r, err := res.Records.ReadRecord()
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, 0, err
		}
		e := policylog.Entry{Offset: r.Offset}
		if r.Key != nil {
			k, err := io.ReadAll(r.Key)
			if err != nil {
				return nil, 0, err
			}
			e.Key = string(k)
		}
		if r.Value != nil {
			v, err := io.ReadAll(io.LimitReader(r.Value, policylog.MaxRecord+1))
			if err != nil {
				return nil, 0, err
			}
			e.Value = v
			if e.Value == nil {
				e.Value = []byte{}
			}
		}
		out = append(out, e)
	}
	return out, res.HighWatermark, nil
}

// ErrUnsafe is wrapped by the error CheckIntegrity returns for a topic
// that can lose records.
var ErrUnsafe = policylog.ErrLogUnsafe

// CheckIntegrity checks that the topic cannot delete records, its
// configuration being topicConfigs' (DescribeConfigs), and returns its
// first offset. Compaction never moves a log's start offset; retention and
// DeleteRecords do, so a start above 0 is a gap that is not compaction
// (policylog.Follower judges it). A failure to ask is returned unwrapped.
func (l *Log) CheckIntegrity(ctx context.Context) (first int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	defer cancel()
	res, err := l.client().DescribeConfigs(ctx, &kafka.DescribeConfigsRequest{Resources: []kafka.DescribeConfigRequestResource{{
		ResourceType: kafka.ResourceTypeTopic, ResourceName: l.cfg.Topic,
		ConfigNames: []string{"cleanup.policy", "retention.ms", "retention.bytes"},
	}}})
	if err != nil {
		return 0, fmt.Errorf("describe the configuration of %s: %w", l.cfg.Topic, err)
	}
	var bad []string
	for _, r := range res.Resources {
		if r.Error != nil {
			return 0, fmt.Errorf("describe the configuration of %s: %w", l.cfg.Topic, r.Error)
		}
		got := map[string]string{}
		for _, e := range r.ConfigEntries {
			got[e.ConfigName] = e.ConfigValue
		}
		for _, name := range []string{"cleanup.policy", "retention.ms", "retention.bytes"} {
			if v, ok := got[name]; !ok || v != topicConfigs[name] {
				bad = append(bad, fmt.Sprintf("%s=%s (want %s)", name, v, topicConfigs[name]))
			}
		}
	}
	if len(bad) > 0 {
		return 0, fmt.Errorf("%w: topic %s has %s; set them with kafka-configs --alter (docs/policy-log-recovery.md)", ErrUnsafe, l.cfg.Topic, strings.Join(bad, ", "))
	}
	return l.FirstOffset(ctx)
}

// FirstOffset is the first offset the log holds (its end when retention
// removed every record).
func (l *Log) FirstOffset(ctx context.Context) (int64, error) {
	off, err := l.client().ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{l.cfg.Topic: {kafka.FirstOffsetOf(0)}}})
	if err != nil {
		return 0, fmt.Errorf("first offset of %s: %w", l.cfg.Topic, err)
	}
	for _, p := range off.Topics[l.cfg.Topic] {
		if p.Error != nil {
			return 0, fmt.Errorf("first offset of %s: %w", l.cfg.Topic, p.Error)
		}
		return max(p.FirstOffset, 0), nil
	}
	return 0, fmt.Errorf("first offset of %s: not in the answer", l.cfg.Topic)
}

// ErrNoTopic is wrapped by the error of Exists, and of a Fetch, for a
// topic that does not exist.
var ErrNoTopic = policylog.ErrNoTopic

// Exists checks that the topic exists without creating it (a metadata
// request that does not allow auto-creation): what a reader that must
// write nothing calls instead of Ensure.
func (l *Log) Exists(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	defer cancel()
	md, err := l.client().Metadata(ctx, &kafka.MetadataRequest{Topics: []string{l.cfg.Topic}})
	if err != nil {
		return fmt.Errorf("metadata of %s: %w", l.cfg.Topic, err)
	}
	for _, t := range md.Topics {
		if t.Name != l.cfg.Topic {
			continue
		}
		if IsNoTopic(t.Error) {
			break
		}
		if t.Error != nil {
			return fmt.Errorf("topic %s: %w", l.cfg.Topic, t.Error)
		}
		return nil
	}
	l.missing()
	return fmt.Errorf("%w: %s (check POLICY_TOPIC; nothing was created)", ErrNoTopic, l.cfg.Topic)
}

// IsNoTopic reports whether err says the topic does not exist (no writer
// has created it yet).
func IsNoTopic(err error) bool {
	return errors.Is(err, ErrNoTopic) || errors.Is(err, protocol.ErrNoTopic) || errors.Is(err, kafka.UnknownTopicOrPartition)
}
