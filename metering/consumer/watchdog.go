package consumer

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/ratewarden/ratewarden/internal/lifecycle"
)

// The stall watchdog. Errors are loud (a WARN line, a restart, /readyz 503);
// a stall is the failure that is not: a partition with messages to read
// whose progress stops while nothing fails (a reader retrying one fetch
// forever). The watchdog does not trust the reading path to say so: it
// asks the broker for each owned partition's high watermark itself, and
// compares it with what reached ClickHouse. A partition that has lag and has
// written nothing for StallAfter while it is running (not failing or backing
// off, which are reported as errors) is stalled: the stall is counted
// (meter_partition_stalls_total), logged, reported by Ready until the
// partition makes progress again, and the partition gets a fresh reader (its
// attempt ends and starts again from the progress in ClickHouse, with new
// connections). While the stall lasts, it is counted again every StallAfter.

// partState is what the watchdog knows of one owned partition.
type partState struct {
	mu      sync.Mutex
	running bool      // reading and writing: not starting, failing or backing off
	next    int64     // first offset not yet written to ClickHouse
	hwm     int64     // highest high watermark seen in this attempt
	since   time.Time // last progress, the start of the attempt, the last check that found no lag, or the last stall
	stalled string    // why it is stalled, until it makes progress
	restart context.CancelFunc
}

// start marks the beginning of an attempt that resumes at offset.
func (s *partState) start(offset int64, restart context.CancelFunc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running, s.next, s.hwm, s.since, s.restart = true, offset, 0, time.Now(), restart
}

// stop marks the end of an attempt.
func (s *partState) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running, s.restart = false, nil
}

// progress records that every offset below next is in ClickHouse; it
// reports whether that ended a stall.
func (s *partState) progress(next int64) (endedStall bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if next > s.next {
		s.next, s.since = next, time.Now()
		endedStall, s.stalled = s.stalled != "", ""
	}
	return endedStall
}

// seen records a high watermark reported by the broker.
func (s *partState) seen(hwm int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hwm = max(s.hwm, hwm)
}

// check decides whether the partition is stalled at now; if so it records
// the stall, restarts the clock and returns the lag and the time without
// progress.
func (s *partState) check(now time.Time, after time.Duration) (stalled bool, lag int64, idle time.Duration, restart context.CancelFunc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	lag, idle = s.hwm-s.next, now.Sub(s.since)
	if lag <= 0 {
		// Caught up: nothing is owed, so no time counts against it. The
		// clock starts again here, else the first messages after a quiet
		// spell would find it idle since its last write and call a
		// partition stalled before its reader had a chance to fetch them.
		s.since = now
		return false, lag, 0, nil
	}
	if !s.running || idle < after {
		return false, lag, idle, nil
	}
	s.stalled = fmt.Sprintf("stalled: no progress for %s with %d messages to read (at offset %d); the reader was restarted", idle.Round(time.Second), lag, s.next)
	s.since = now
	return true, lag, idle, s.restart
}

func (s *partState) stallReason() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stalled
}

func (s *partState) isRunning() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running
}

// watch runs the watchdog until ctx ends.
func (c *Consumer) watch(ctx context.Context) {
	client, tr := c.kafkaClient("meter-consumer-watchdog")
	defer tr.CloseIdleConnections()
	every := min(max(c.cfg.StallAfter/4, 100*time.Millisecond), 5*time.Second)
	lifecycle.Every(ctx, every, func(ctx context.Context) {
		parts := c.owned()
		if len(parts) == 0 {
			return
		}
		c.probe(ctx, client, parts, min(every*4, 5*time.Second))
		now := time.Now()
		for _, p := range sortedKeys(parts) {
			stalled, lag, idle, restart := parts[p].check(now, c.cfg.StallAfter)
			if !stalled {
				continue
			}
			c.m.stalls.WithLabelValues(strconv.Itoa(p)).Inc()
			c.log.Warn("partition stalled: no progress while it has messages to read; restarting its reader",
				"partition", p, "lag", lag, "idle", idle.Round(time.Millisecond).String(), "stall_after", c.cfg.StallAfter.String())
			if restart != nil {
				restart()
			}
		}
	})
}

// probe asks the broker for the high watermarks of the running partitions.
// A failed probe leaves the watermarks the fetches reported: when the
// broker cannot be asked, the reading path fails loudly on its own.
func (c *Consumer) probe(ctx context.Context, client *kafka.Client, parts map[int]*partState, timeout time.Duration) {
	var reqs []kafka.OffsetRequest
	for p, s := range parts {
		if s.isRunning() {
			reqs = append(reqs, kafka.LastOffsetOf(p))
		}
	}
	if len(reqs) == 0 {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	res, err := client.ListOffsets(pctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{c.cfg.Topic: reqs}})
	if err != nil {
		if ctx.Err() == nil {
			c.log.Debug("stall watchdog: list offsets", "err", err)
		}
		return
	}
	for _, po := range res.Topics[c.cfg.Topic] {
		if s, ok := parts[po.Partition]; ok && po.Error == nil {
			s.seen(po.LastOffset)
		}
	}
}

func (c *Consumer) owned() map[int]*partState {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[int]*partState, len(c.parts))
	for p, s := range c.parts {
		out[p] = s
	}
	return out
}

func sortedKeys[V any](m map[int]V) []int {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	return keys
}
