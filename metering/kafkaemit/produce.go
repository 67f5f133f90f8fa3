package kafkaemit

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"sort"
	"sync"
	"time"

	"github.com/pierrec/lz4/v4"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
)

// producer writes batches with kafka-go's Client.RawProduce: the emitter
// builds each partition's record batch itself (Kafka's format v2, the
// library's compression codec) in pooled buffers, and sends the
// partitions of a batch at once. kafka-go's Writer, which it replaces,
// spent most of the emitter's CPU per event on work a pre-encoded batch
// does not need: a metadata lookup and a record object per message, a
// copy of every key and value through its encoder, and per-partition
// batches rebuilt from messages (BENCHMARKS.md, Metering).
//
// The partitioning is the Writer's kafka.Hash (FNV-1a, Sarama's), so an
// event resent from a spool written by an older emitter lands in the
// partition of its first copy, where the consumer's deduplication finds it.
// Safe for concurrent use (the writer and the spool's drainer).
type producer struct {
	client  *kafka.Client
	topic   string
	acks    kafka.RequiredAcks
	codec   kafka.Compression // 0 = none
	retries int               // attempts per partition and batch
	backoff time.Duration     // before the first retry, doubling

	mu       sync.Mutex
	parts    []int // partition ids, sorted
	partsAt  time.Time
	partsTTL time.Duration

	bufs sync.Pool // *[]byte, a partition's record set
	raws sync.Pool // *[]byte, its records before compression
	lz4s sync.Pool // *lz4.Writer without a content checksum (compressor)
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func newProducer(client *kafka.Client, topic string, codec kafka.Compression) *producer {
	return &producer{client: client, topic: topic, acks: kafka.RequireAll, codec: codec, retries: 3,
		backoff: 50 * time.Millisecond, partsTTL: 10 * time.Second}
}

// partitions returns the topic's partition ids, from a cache of partsTTL.
func (p *producer) partitions(ctx context.Context) ([]int, error) {
	p.mu.Lock()
	parts, at := p.parts, p.partsAt
	p.mu.Unlock()
	if parts != nil && time.Since(at) < p.partsTTL {
		return parts, nil
	}
	md, err := p.client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{p.topic}})
	if err != nil {
		return nil, err
	}
	for _, t := range md.Topics {
		if t.Name != p.topic {
			continue
		}
		if t.Error != nil {
			return nil, t.Error
		}
		ids := make([]int, 0, len(t.Partitions))
		for _, pt := range t.Partitions {
			ids = append(ids, pt.ID)
		}
		if len(ids) == 0 {
			break
		}
		sort.Ints(ids)
		p.mu.Lock()
		p.parts, p.partsAt = ids, time.Now()
		p.mu.Unlock()
		return ids, nil
	}
	return nil, kafka.UnknownTopicOrPartition
}

// forget drops the cached partitions (after a partition error, so that a
// changed topic is read again).
func (p *producer) forget() {
	p.mu.Lock()
	p.parts = nil
	p.mu.Unlock()
}

// partitionOf is kafka.Hash's choice among n partitions.
func partitionOf(key []byte, n int) int {
	h := uint32(2166136261)
	for _, c := range key {
		h ^= uint32(c)
		h *= 16777619
	}
	i := int32(h) % int32(n)
	if i < 0 {
		i = -i
	}
	return int(i)
}

// write sends msgs, each to its key's partition, all partitions at once.
// nil when Kafka acknowledged every message; otherwise kafka.WriteErrors,
// one per message (nil for those written), or, when nothing could be sent
// (no metadata), that error.
func (p *producer) write(ctx context.Context, msgs []kafka.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	parts, err := p.partitions(ctx)
	if err != nil {
		return fmt.Errorf("kafkaemit: metadata of %s: %w", p.topic, err)
	}
	byPart := make([][]int32, len(parts))
	for i := range msgs {
		j := partitionOf(msgs[i].Key, len(parts))
		byPart[j] = append(byPart[j], int32(i))
	}
	errs := make([]error, len(parts))
	var wg sync.WaitGroup
	for j, idx := range byPart {
		if len(idx) == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[j] = p.writePartition(ctx, parts[j], msgs, idx)
		}()
	}
	wg.Wait()
	var werrs kafka.WriteErrors
	for j, e := range errs {
		if e == nil {
			continue
		}
		if werrs == nil {
			werrs = make(kafka.WriteErrors, len(msgs))
		}
		for _, i := range byPart[j] {
			werrs[i] = e
		}
	}
	if werrs == nil {
		return nil
	}
	return werrs
}

// writePartition sends the messages idx of msgs to partition as one record
// batch, retrying what Kafka or the network calls temporary.
func (p *producer) writePartition(ctx context.Context, partition int, msgs []kafka.Message, idx []int32) error {
	bp, _ := p.bufs.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	buf, err := p.appendRecordSet((*bp)[:0], msgs, idx, time.Now().UnixMilli())
	if err != nil {
		return err
	}
	backoff := p.backoff
	for attempt := 1; ; attempt++ {
		var resp *kafka.ProduceResponse
		resp, err = p.client.RawProduce(ctx, &kafka.RawProduceRequest{Topic: p.topic, Partition: partition,
			RequiredAcks: p.acks, RawRecords: protocol.RawRecordSet{Reader: bytes.NewReader(buf)}})
		if err == nil && resp != nil && resp.Error != nil {
			err = resp.Error
		}
		if err == nil {
			*bp = buf
			p.bufs.Put(bp) // only after a success: a request that timed out may still be read
			return nil
		}
		var ke kafka.Error
		if errors.As(err, &ke) && (ke == kafka.NotLeaderForPartition || ke == kafka.UnknownTopicOrPartition || ke == kafka.LeaderNotAvailable) {
			p.forget()
		}
		if attempt >= p.retries || !retriable(err) || ctx.Err() != nil {
			return err
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// retriable: an error a later attempt may not meet (Kafka's temporary
// codes, a connection that failed); not one of the record itself.
func retriable(err error) bool {
	var ke kafka.Error
	if errors.As(err, &ke) {
		return ke.Temporary()
	}
	var ne net.Error
	return errors.As(err, &ne) || classify(err) == ReasonUnconfirmed
}

// appendRecordSet appends the request's record set for msgs[idx]: its size
// (int32), then one record batch of format v2 (magic 2) whose records
// carry the batch's time ts (ms), compressed with the producer's codec.
func (p *producer) appendRecordSet(dst []byte, msgs []kafka.Message, idx []int32, ts int64) ([]byte, error) {
	start := len(dst)
	dst = append(dst, make([]byte, 4+61)...) // size, then the batch header, filled below
	if p.codec == 0 {
		dst = appendRecords(dst, msgs, idx)
	} else {
		w, err := p.compressor((*appender)(&dst))
		if err != nil {
			return dst[:start], err
		}
		rp, _ := p.raws.Get().(*[]byte)
		if rp == nil {
			rp = new([]byte)
		}
		*rp = appendRecords((*rp)[:0], msgs, idx) // compressed from here into dst
		_, err = w.Write(*rp)
		if cerr := w.Close(); err == nil {
			err = cerr
		}
		p.raws.Put(rp)
		if err != nil {
			return dst[:start], err
		}
	}
	b := dst[start:]
	be := binary.BigEndian
	be.PutUint32(b[0:], uint32(len(b)-4))    // the record set's size
	h := b[4:]                               // the batch
	be.PutUint64(h[0:], 0)                   // base offset
	be.PutUint32(h[8:], uint32(len(h)-12))   // batch length
	be.PutUint32(h[12:], 0xffffffff)         // partition leader epoch: -1
	h[16] = 2                                // magic
	be.PutUint16(h[21:], uint16(p.codec)&7)  // attributes: the codec
	be.PutUint32(h[23:], uint32(len(idx)-1)) // last offset delta
	be.PutUint64(h[27:], uint64(ts))         // first timestamp
	be.PutUint64(h[35:], uint64(ts))         // max timestamp
	be.PutUint64(h[43:], 0xffffffffffffffff) // producer id: -1
	be.PutUint16(h[51:], 0xffff)             // producer epoch: -1
	be.PutUint32(h[53:], 0xffffffff)         // base sequence: -1
	be.PutUint32(h[57:], uint32(len(idx)))   // records
	be.PutUint32(h[17:], crc32.Checksum(h[21:], castagnoli))
	return dst, nil
}

// compressor is a writer compressing into dst with the producer's codec.
// LZ4 frames are written without their optional content checksum (the
// library's codec writes one): the record batch's CRC already covers the
// compressed bytes, and the checksum cost the emitter and every consumer
// an xxHash pass over each batch.
func (p *producer) compressor(dst io.Writer) (io.WriteCloser, error) {
	if p.codec != kafka.Lz4 {
		codec := p.codec.Codec()
		if codec == nil {
			return nil, fmt.Errorf("kafkaemit: no codec for compression %d", p.codec)
		}
		return codec.NewWriter(dst), nil
	}
	z, _ := p.lz4s.Get().(*lz4.Writer)
	if z == nil {
		z = lz4.NewWriter(nil)
		if err := z.Apply(lz4.ChecksumOption(false)); err != nil {
			return nil, err
		}
	}
	z.Reset(dst)
	return &pooledLZ4{z, p}, nil
}

// pooledLZ4 returns its writer to the producer's pool when closed.
type pooledLZ4 struct {
	*lz4.Writer
	p *producer
}

func (w *pooledLZ4) Close() error {
	err := w.Writer.Close()
	w.Writer.Reset(nil)
	w.p.lz4s.Put(w.Writer)
	return err
}

// appendRecords appends the records of msgs[idx], offset deltas 0, 1, …,
// timestamp delta 0, no headers.
func appendRecords(dst []byte, msgs []kafka.Message, idx []int32) []byte {
	for d, i := range idx {
		m := &msgs[i]
		off := int64(d)
		klen := int64(len(m.Key))
		if m.Key == nil {
			klen = -1
		}
		n := 1 + 1 + varintLen(off) + varintLen(klen) + len(m.Key) +
			varintLen(int64(len(m.Value))) + len(m.Value) + 1
		dst = binary.AppendVarint(dst, int64(n))
		dst = append(dst, 0, 0) // attributes; timestamp delta 0 (varint)
		dst = binary.AppendVarint(dst, off)
		if m.Key == nil {
			dst = binary.AppendVarint(dst, -1) // a null key
		} else {
			dst = binary.AppendVarint(dst, int64(len(m.Key)))
			dst = append(dst, m.Key...)
		}
		dst = binary.AppendVarint(dst, int64(len(m.Value)))
		dst = append(dst, m.Value...)
		dst = append(dst, 0) // headers: 0
	}
	return dst
}

func varintLen(v int64) int {
	u := uint64(v<<1) ^ uint64(v>>63)
	n := 1
	for u >= 0x80 {
		u >>= 7
		n++
	}
	return n
}

// appender is an io.Writer appending to a slice.
type appender []byte

func (a *appender) Write(b []byte) (int, error) {
	*a = append(*a, b...)
	return len(b), nil
}
