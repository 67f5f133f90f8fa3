package notify

import (
	"context"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/ratewarden/ratewarden/metering"
)

// One generation of the consumer group: a goroutine per assigned partition
// reads it (from the offset locate chose: epoch.go) into one channel, and
// one goroutine decides every message in order of arrival, so the
// cool-downs have one owner. All of them are started with Generation.Start,
// so the group waits for them before the next generation: two generations
// never decide at once. The decider commits, about once a second, the
// offsets it has decided (never read back as the truth: locate checks them)
// and records a checkpoint per partition.

// runGeneration starts the generation's goroutines and returns; the group
// waits for them.
func (n *Notifier) runGeneration(ctx, deliverCtx context.Context, gen *kafka.Generation) {
	parts := gen.Assignments[n.cfg.Topic]
	msgs := make(chan fetched, 256)
	for _, pa := range parts {
		p, committed := pa.ID, pa.Offset
		gen.Start(func(gctx context.Context) { n.readPartition(gctx, p, committed, msgs) })
	}
	gen.Start(func(gctx context.Context) { n.decide(gctx, deliverCtx, gen, msgs) })
}

// kafkaError counts and logs an error of the notifier's Kafka side (each is
// retried).
func (n *Notifier) kafkaError(err error) {
	n.m.kafkaErrors.Inc()
	n.log.Warn("notifier: kafka reader", "err", err)
}

// readPartition reads partition p until ctx ends; after a failed fetch it
// checks the log again (a broker replaced under it is a log that started
// over).
func (n *Notifier) readPartition(ctx context.Context, p int, committed int64, out chan<- fetched) {
	tr := &kafka.Transport{DialTimeout: 5 * time.Second, MetadataTopics: []string{n.cfg.Topic}, ClientID: "notifier", TLS: n.cfg.TLS, SASL: n.cfg.SASL}
	defer tr.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(n.cfg.Brokers...), Transport: tr}
	next := committed
	for ctx.Err() == nil {
		off, err := n.locate(ctx, client, p, next)
		if err != nil {
			if ctx.Err() == nil {
				n.kafkaError(fmt.Errorf("partition %d: %w", p, err))
				sleep(ctx, time.Second)
			}
			continue
		}
		next = off
		for ctx.Err() == nil {
			start := time.Now()
			batch, after, err := n.fetch(ctx, client, p, next, readerMaxWait-time.Second)
			if err != nil {
				if ctx.Err() == nil {
					n.kafkaError(err)
					sleep(ctx, time.Second)
				}
				break // check the log again
			}
			for _, m := range batch {
				select {
				case out <- m:
				case <-ctx.Done():
					return
				}
			}
			if len(batch) == 0 && after == next {
				sleep(ctx, readerMaxWait-time.Second-time.Since(start))
			}
			next = after
		}
	}
}

func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// decide handles the generation's messages until ctx ends, committing and
// checkpointing what it decided about once a second and at the end.
func (n *Notifier) decide(ctx, deliverCtx context.Context, gen *kafka.Generation, msgs <-chan fetched) {
	decided := map[int]checkpoint{} // partition → the last message decided (offset, event id)
	dirty := false
	flush := func() {
		if !dirty {
			return
		}
		offsets := map[int]int64{}
		for p, c := range decided {
			offsets[p] = c.offset + 1
		}
		if err := gen.CommitOffsets(map[string]map[int]int64{n.cfg.Topic: offsets}); err != nil {
			n.kafkaError(fmt.Errorf("commit: %w", err))
		}
		// The checkpoint is what tells this log from the next one; its write
		// must not hold the next decisions (a ClickHouse outage delays
		// records, never a delivery): a failure leaves an older checkpoint,
		// which tells the logs apart as well.
		cps := make(map[int]checkpoint, len(decided))
		for p, c := range decided {
			cps[p] = c
		}
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		if err := n.saveCheckpoints(wctx, cps); err != nil {
			n.log.Warn("notifier: checkpoint not recorded", "err", err)
		}
		cancel()
		dirty = false
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			flush()
			return
		case <-tick.C:
			flush()
		case m := <-msgs:
			n.m.events.Inc()
			ev, err := metering.Decode(m.value)
			if err != nil {
				n.m.badEvents.Inc()
			} else {
				n.handle(deliverCtx, ev)
			}
			decided[m.partition] = checkpoint{offset: m.offset, id: ev.EventID}
			dirty = true
		}
	}
}
