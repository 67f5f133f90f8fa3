package consumer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"time"

	"github.com/segmentio/kafka-go"
)

// A partition is read with kafka-go's Client.Fetch, not its Reader: the
// Reader uses the fetch's MaxWait as the socket deadline of the whole
// fetch (segmentio/kafka-go#574), so a broker or machine slower than
// MaxWait to deliver a response makes every fetch time out; the Reader
// then retries the same offset forever, reports it only to its optional
// ErrorLogger and never to FetchMessage, and the partition stops without a
// trace (a catch-up fetch after a rebalance on a busy machine can take
// longer than a short MaxWait). Here the broker is asked to
// wait MaxWait, the round trip is given MaxWait plus FetchTimeout, and any
// failure ends the fetcher with an error the consumer logs and recovers
// from.

// fetchResult is what one fetch produced: the messages at or after the
// offset asked for, in order, the partition's high watermark then and the
// offset the fetcher reads next; or the error that ended the fetcher.
type fetchResult struct {
	msgs []fetchedMsg
	hwm  int64
	next int64
	err  error
}

type fetchedMsg struct {
	offset int64
	value  string // a slice of one string per fetch (fetch)
}

// fetcher reads one partition ahead of the consumer (so that the next
// messages arrive while a batch is written) on a transport of its own: a
// fresh fetcher is a fresh reader, with new connections and metadata.
type fetcher struct {
	client    *kafka.Client
	transport *kafka.Transport
	topic     string
	partition int
	maxWait   time.Duration // what the broker may wait for data
	timeout   time.Duration // network allowance on top of maxWait
	maxBytes  int64
	log       *slog.Logger
	scratch   []byte // the values of one fetch, reused

	out    chan fetchResult // closed never; the owner stops the fetcher with stop
	cancel context.CancelFunc
	done   chan struct{} // closed when run has returned
}

// fetchQueue bounds the responses read ahead (each at most maxBytes).
const fetchQueue = 4

// startFetcher starts reading partition p at offset. The caller owns the
// fetcher and must call stop.
func startFetcher(ctx context.Context, c *Consumer, p int, offset int64) *fetcher {
	client, tr := c.kafkaClient("meter-consumer")
	fctx, cancel := context.WithCancel(ctx)
	f := &fetcher{
		client:    client,
		transport: tr,
		topic:     c.cfg.Topic,
		partition: p,
		maxWait:   c.cfg.FetchMaxWait,
		timeout:   c.cfg.FetchTimeout,
		maxBytes:  1 << 20, // kfake builds each fetch response in its single loop: keep them small
		log:       c.log,
		out:       make(chan fetchResult, fetchQueue),
		cancel:    cancel,
		done:      make(chan struct{}),
	}
	go func() {
		defer close(f.done)
		f.run(fctx, offset)
	}()
	return f
}

// stop ends the fetch in flight, waits for the fetcher's goroutine and
// releases its connections.
func (f *fetcher) stop() {
	f.cancel()
	<-f.done
	f.transport.CloseIdleConnections()
}

func (f *fetcher) run(ctx context.Context, offset int64) {
	for {
		start := time.Now()
		msgs, hwm, next, err := f.fetch(ctx, offset)
		if ctx.Err() != nil {
			return
		}
		select {
		case f.out <- fetchResult{msgs: msgs, hwm: hwm, next: next, err: err}:
		case <-ctx.Done():
			return
		}
		if err != nil {
			return
		}
		// A broker answers an empty fetch when MaxWait has passed; one that
		// answers sooner is not asked again at once (no busy loop).
		if len(msgs) == 0 && next == offset {
			if wait := f.maxWait - time.Since(start); wait > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(wait):
				}
			}
		}
		offset = next
	}
}

// fetch reads the messages at offset and after; next is the offset to ask
// for next.
func (f *fetcher) fetch(ctx context.Context, offset int64) (msgs []fetchedMsg, hwm, next int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, f.maxWait+f.timeout)
	defer cancel()
	resp, err := f.client.Fetch(ctx, &kafka.FetchRequest{
		Topic: f.topic, Partition: f.partition, Offset: offset,
		MinBytes: 1, MaxBytes: f.maxBytes, MaxWait: f.maxWait,
	})
	if err != nil {
		return nil, 0, offset, fmt.Errorf("fetch partition %d at offset %d: %w", f.partition, offset, err)
	}
	if resp.Error != nil {
		if errors.Is(resp.Error, kafka.OffsetOutOfRange) {
			// Retention deleted it, or the log started over: the partition
			// resumes, and resuming finds out which (epoch.go).
			return nil, 0, offset, fmt.Errorf("fetch partition %d at offset %d: %w: the log no longer holds it; resuming checks which log this is", f.partition, offset, resp.Error)
		}
		return nil, 0, offset, fmt.Errorf("fetch partition %d at offset %d: %w", f.partition, offset, resp.Error)
	}
	next = offset
	// The values are read into scratch, then copied into one string: the
	// decoder's event ids and keys are slices of it, so a fetch costs one
	// allocation for its values, not one per message or field.
	f.scratch = f.scratch[:0]
	var ends []int
	for {
		rec, err := resp.Records.ReadRecord()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, 0, offset, fmt.Errorf("fetch partition %d at offset %d: read record: %w", f.partition, offset, err)
		}
		start := len(f.scratch)
		f.scratch, err = appendValue(f.scratch, rec)
		if err != nil {
			return nil, 0, offset, fmt.Errorf("fetch partition %d at offset %d: read record %d: %w", f.partition, offset, rec.Offset, err)
		}
		if rec.Offset < offset {
			f.scratch = f.scratch[:start]
			continue // a batch may start before the offset asked for
		}
		msgs = append(msgs, fetchedMsg{offset: rec.Offset})
		ends = append(ends, len(f.scratch))
		next = rec.Offset + 1
	}
	values, start := string(f.scratch), 0
	for i, end := range ends {
		msgs[i].value, start = values[start:end], end
	}
	return msgs, resp.HighWatermark, next, nil
}

// kafkaClient is a client of the brokers on a transport of its own (the
// caller closes its idle connections when done), reaching them the way
// Config says (TLS, SASL): every request the consumer makes outside the
// group's reader, the watchdog's included, goes through one of these.
func (c *Consumer) kafkaClient(clientID string) (*kafka.Client, *kafka.Transport) {
	tr := &kafka.Transport{
		DialTimeout:    5 * time.Second,
		MetadataTopics: []string{c.cfg.Topic},
		ClientID:       clientID,
		TLS:            c.cfg.TLS,
		SASL:           c.cfg.SASL,
	}
	return &kafka.Client{Addr: kafka.TCP(c.cfg.Brokers...), Transport: tr}, tr
}

// appendValue appends a fetched record's value to dst and releases the
// record's key and value.
func appendValue(dst []byte, rec *kafka.Record) ([]byte, error) {
	defer func() {
		if rec.Key != nil {
			rec.Key.Close()
		}
		if rec.Value != nil {
			rec.Value.Close()
		}
	}()
	if rec.Value == nil {
		return dst, nil
	}
	start := len(dst)
	dst = slices.Grow(dst, rec.Value.Len())[:start+rec.Value.Len()]
	if _, err := io.ReadFull(rec.Value, dst[start:]); err != nil {
		return dst[:start], err
	}
	return dst, nil
}
