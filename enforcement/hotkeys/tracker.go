// Package hotkeys makes hot keys visible (design study, section 6.3: "a hot
// key is invisible in an average"): a bounded top-K of the busiest
// (key, scope) pairs kept by a streaming space-saving sketch, decisions per
// second per Redis shard, a Prometheus collector that exports only the top
// 10 (label cardinality stays bounded) and a JSON admin handler.
//
// # Design
//
// A Tracker counts in windows of Config.Window. Each window holds Shards
// independent sketches (a key always lands in the same one, so their top
// lists merge exactly) each behind its own mutex, and one atomic counter per
// Redis Cluster hash slot. The window rotates lazily on the first Record or
// Snapshot after it ends; rates are computed over the previous and the
// current window together. Memory is fixed: Shards × Capacity counters and
// 16,384 slot counters per window, two windows.
package hotkeys

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/keyslot"
)

// Config configures a Tracker. The zero value of each field is its documented default.
type Config struct {
	// Capacity is the number of counters per sketch shard (default 64).
	// Keys above total ÷ (Capacity × Shards) decisions per window are
	// always held.
	Capacity int
	// Shards is the number of independent sketches (default 16).
	Shards int
	// Window is the counting window (default 10s).
	Window time.Duration
	// SlotOf is the Redis Cluster hash slot of the bucket of (key, scope)
	// (default KeySlot: redisstore's layout, where the rate-limit key is
	// the hash tag).
	SlotOf func(key, scope string) uint16
	// Owner names the shard serving a hash slot, e.g. "127.0.0.1:7000"
	// (default: every slot is "redis", one standalone server).
	Owner func(slot uint16) string
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Tracker counts decisions per key and per slot. It is safe for concurrent use.
type Tracker struct {
	cfg   Config
	rotMu sync.Mutex
	cur   atomic.Pointer[window]
	prev  atomic.Pointer[window]
}

type window struct {
	start  time.Time
	shards []sketchShard
	slots  [keyslot.Count]atomic.Uint32
	total  atomic.Uint64
}

type sketchShard struct {
	mu sync.Mutex
	sk *sketch
	_  [40]byte // keep shard locks on separate cache lines
}

// New returns a Tracker.
func New(cfg Config) *Tracker {
	if cfg.Capacity <= 0 {
		cfg.Capacity = 64
	}
	if cfg.Shards <= 0 {
		cfg.Shards = 16
	}
	if cfg.Window <= 0 {
		cfg.Window = 10 * time.Second
	}
	if cfg.SlotOf == nil {
		cfg.SlotOf = keyslot.KeySlot
	}
	if cfg.Owner == nil {
		cfg.Owner = func(uint16) string { return "redis" }
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	t := &Tracker{cfg: cfg}
	t.cur.Store(t.newWindow(cfg.Now()))
	return t
}

func (t *Tracker) newWindow(start time.Time) *window {
	w := &window{start: start, shards: make([]sketchShard, t.cfg.Shards)}
	for i := range w.shards {
		w.shards[i].sk = newSketch(t.cfg.Capacity)
	}
	return w
}

// current returns the window for now, rotating when the current one ended.
func (t *Tracker) current(now time.Time) *window {
	w := t.cur.Load()
	if now.Sub(w.start) < t.cfg.Window {
		return w
	}
	t.rotMu.Lock()
	defer t.rotMu.Unlock()
	if w = t.cur.Load(); now.Sub(w.start) < t.cfg.Window {
		return w
	}
	// Windows stay aligned to the first one's start, so the previous
	// window and the current one are contiguous.
	elapsed := now.Sub(w.start)
	next := t.newWindow(w.start.Add(elapsed - elapsed%t.cfg.Window))
	if elapsed < 2*t.cfg.Window {
		t.prev.Store(w)
	} else {
		t.prev.Store(nil) // a gap: the old window says nothing about now
	}
	t.cur.Store(next)
	return next
}

// Record counts one decision for (key, scope); shared says the shared tier
// answered it (a Redis operation).
func (t *Tracker) Record(key, scope string, shared bool) {
	w := t.current(t.cfg.Now())
	slot := t.cfg.SlotOf(key, scope)
	w.slots[slot].Add(1)
	w.total.Add(1)
	sh := &w.shards[int(slot)%len(w.shards)]
	sh.mu.Lock()
	sh.sk.add(id{key, scope}, shared)
	sh.mu.Unlock()
}

// KeyRate is one hot key.
type KeyRate struct {
	Key                string  `json:"key"`
	Scope              string  `json:"scope"`
	OpsPerSecond       float64 `json:"opsPerSecond"`
	SharedOpsPerSecond float64 `json:"sharedOpsPerSecond"` // answered by the shared tier
	// MaxOverestimate bounds how much OpsPerSecond may overstate the truth
	// (the space-saving error of the counter).
	MaxOverestimate float64 `json:"maxOverestimate"`
	Slot            uint16  `json:"slot"`
	Shard           string  `json:"shard"`
	// MetricKey is the key's label in the limiter_hot_key_* metrics (a
	// keyed hash, or the key when raw keys are chosen); set by Handler.
	MetricKey string `json:"metricKey,omitempty"`
}

// ShardRate is the decision rate of one Redis shard.
type ShardRate struct {
	Shard        string  `json:"shard"`
	OpsPerSecond float64 `json:"opsPerSecond"`
}

// Snapshot is the view over the last one to two windows.
type Snapshot struct {
	At                time.Time   `json:"at"`
	WindowSeconds     float64     `json:"windowSeconds"` // the span the rates are averaged over
	TotalOpsPerSecond float64     `json:"totalOpsPerSecond"`
	Keys              []KeyRate   `json:"keys"`
	Shards            []ShardRate `json:"shards"`
}

// Snapshot returns the n hottest keys and every shard's rate.
func (t *Tracker) Snapshot(n int) Snapshot {
	now := t.cfg.Now()
	cur := t.current(now)
	prev := t.prev.Load()
	span := now.Sub(cur.start)
	wins := []*window{cur}
	if prev != nil {
		wins = append(wins, prev)
		span += t.cfg.Window
	}
	secs := max(span.Seconds(), 1e-3)

	type agg struct {
		count, err, shared uint64
	}
	all := make(map[id]*agg)
	var total uint64
	shardOps := make(map[string]uint64)
	for _, w := range wins {
		total += w.total.Load()
		for i := range w.shards {
			sh := &w.shards[i]
			sh.mu.Lock()
			for _, c := range sh.sk.heap {
				a := all[c.id]
				if a == nil {
					a = &agg{}
					all[c.id] = a
				}
				a.count += c.count
				a.err += c.err
				a.shared += c.shared
			}
			sh.mu.Unlock()
		}
		for s := range w.slots {
			if v := w.slots[s].Load(); v > 0 {
				shardOps[t.cfg.Owner(uint16(s))] += uint64(v)
			}
		}
	}
	snap := Snapshot{At: now.UTC(), WindowSeconds: secs, TotalOpsPerSecond: float64(total) / secs}
	for k, a := range all {
		slot := t.cfg.SlotOf(k.key, k.scope)
		snap.Keys = append(snap.Keys, KeyRate{
			Key: k.key, Scope: k.scope,
			OpsPerSecond:       float64(a.count) / secs,
			SharedOpsPerSecond: float64(a.shared) / secs,
			MaxOverestimate:    float64(a.err) / secs,
			Slot:               slot,
			Shard:              t.cfg.Owner(slot),
		})
	}
	slices.SortFunc(snap.Keys, func(a, b KeyRate) int {
		return cmp.Or(cmp.Compare(b.OpsPerSecond, a.OpsPerSecond), cmp.Compare(a.Key, b.Key), cmp.Compare(a.Scope, b.Scope))
	})
	if len(snap.Keys) > n {
		snap.Keys = snap.Keys[:n]
	}
	for s, ops := range shardOps {
		snap.Shards = append(snap.Shards, ShardRate{Shard: s, OpsPerSecond: float64(ops) / secs})
	}
	slices.SortFunc(snap.Shards, func(a, b ShardRate) int { return cmp.Compare(a.Shard, b.Shard) })
	return snap
}

// Observer is an enforcement.Observer that records every decision in a
// Tracker and passes everything on to Next (which may be nil).
type Observer struct {
	Tracker *Tracker
	Next    enforcement.Observer
}

var _ enforcement.Observer = Observer{}

// Decided implements enforcement.Observer.
func (o Observer) Decided(req enforcement.Request, d enforcement.Decision, took time.Duration) {
	o.Tracker.Record(req.Key, req.Scope, d.Source == enforcement.SourceShared)
	if o.Next != nil {
		o.Next.Decided(req, d, took)
	}
}

// AuthorityFailed implements enforcement.Observer.
func (o Observer) AuthorityFailed(err error) {
	if o.Next != nil {
		o.Next.AuthorityFailed(err)
	}
}

// ClockBack implements enforcement.Observer.
func (o Observer) ClockBack() {
	if o.Next != nil {
		o.Next.ClockBack()
	}
}
