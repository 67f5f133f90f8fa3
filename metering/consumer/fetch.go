package consumer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
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
	lastSize  int // the bytes of the last fetch's values

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
	// The values are written into one string as they are read (a
	// strings.Builder, grown to the last fetch's size): the decoder's event
	// ids and keys are slices of it, so a fetch costs one allocation and
	// one copy of its values, not one per message or field.
	var values strings.Builder
	values.Grow(f.lastSize)
	var ends []int
	for {
		rec, err := resp.Records.ReadRecord()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, 0, offset, fmt.Errorf("fetch partition %d at offset %d: read record: %w", f.partition, offset, err)
		}
		if rec.Offset < offset {
			release(rec)
			continue // a batch may start before the offset asked for
		}
		if err := writeValue(&values, rec); err != nil {
			return nil, 0, offset, fmt.Errorf("fetch partition %d at offset %d: read record %d: %w", f.partition, offset, rec.Offset, err)
		}
		msgs = append(msgs, fetchedMsg{offset: rec.Offset})
		ends = append(ends, values.Len())
		next = rec.Offset + 1
	}
	f.lastSize = values.Len()
	all, start := values.String(), 0
	for i, end := range ends {
		msgs[i].value, start = all[start:end], end
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

// writeValue writes a fetched record's value to w and releases the
// record.
func writeValue(w io.Writer, rec *kafka.Record) error {
	defer release(rec)
	if rec.Value == nil {
		return nil
	}
	_, err := io.Copy(w, rec.Value) // kafka-go's values write their pages to w: no copy between
	return err
}

// release gives a fetched record's key and value back to kafka-go.
func release(rec *kafka.Record) {
	if rec.Key != nil {
		rec.Key.Close()
	}
	if rec.Value != nil {
		rec.Value.Close()
	}
}
