package redisstore

// Support tools' view of one key in the store (inspect) and their one
// write (reset): scripts of their own, so that a snapshot is read at one
// moment and a reset lands with its audit record or not at all. The key
// layout is keyslot's and limits.QuotaKey's, never written here.

import (
	"context"
	_ "embed"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/keyslot"
	"github.com/ratewarden/ratewarden/enforcement/split"
)

var (
	//go:embed inspect.lua
	inspectLua string
	//go:embed reset.lua
	resetLua string
	//go:embed audit.lua
	auditLua string
	//go:embed reservations.lua
	reservationsLua string

	inspectScript = newSpendScript(inspectLua)
	resetScript   = newSpendScript(stateLua + resetLua) // sent at most once: a reset must not apply twice
	auditScript   = newSpendScript(auditLua)
	openScript    = newSpendScript(reservationsLua)
)

// ResetsKept is how many audit records of one key's resets the store
// keeps, newest first.
const ResetsKept = 100

// BucketView is one bucket as the store holds it, read without writing.
type BucketView struct {
	RedisKey string `json:"redisKey"`
	// Present: the store holds the key; a bucket it does not hold is full.
	Present bool `json:"present"`
	// Tokens is the bucket refilled to the store's clock (below zero: in
	// debt); Capacity and Rate are the limit's.
	Tokens   float64 `json:"tokens"`
	Capacity int64   `json:"capacity"`
	Rate     float64 `json:"rate"`
	// Debt is how far below zero the bucket is (0: none).
	Debt float64 `json:"debt"`
	// FullAt is when the bucket is full again, on the store's clock.
	FullAt time.Time `json:"fullAt"`
	// TTL is the key's time to live (-1 ms: none; 0: absent).
	TTLms int64 `json:"ttlMs"`
}

// QuotaView is the calendar quota's current window.
type QuotaView struct {
	RedisKey string    `json:"redisKey"`
	Limit    int64     `json:"limit"`
	Used     int64     `json:"used"`
	Left     int64     `json:"left"`
	Period   string    `json:"period"`
	ResetAt  time.Time `json:"resetAt"`
	TTLms    int64     `json:"ttlMs"`
}

// KeyView is one (key, scope) in the store: its bucket (or, for a split
// limit, each sub-bucket), its quota window and the audit of its resets,
// newest first (raw JSON records, as reset wrote them).
type KeyView struct {
	StoreTime time.Time         `json:"storeTime"`
	Bucket    BucketView        `json:"bucket"`
	Split     []BucketView      `json:"split,omitempty"`
	Quota     *QuotaView        `json:"quota,omitempty"`
	Resets    []json.RawMessage `json:"-"`
}

// Inspect reads (key, scope) under lim without writing: one script per
// hash tag (the key's, and each split sub-key's), so each part is read at
// one moment.
func (s *Store) Inspect(ctx context.Context, key, scope string, lim enforcement.Limit, resets int) (KeyView, error) {
	var kv KeyView
	bkey, qkey, _ := s.callKeys(key, scope, lim)
	keys := []string{bkey}
	if lim.HasQuota() {
		keys = append(keys, qkey)
	}
	keys = append(keys, keyslot.ResetLogKey(s.prefix, key))
	raw, err := inspectScript.run(ctx, s.rdb, keys, max(1, resets)).Slice()
	if err != nil {
		return kv, fmt.Errorf("redis inspect of %q: %w", bkey, err)
	}
	if len(raw) != len(keys)+1 {
		return kv, fmt.Errorf("redis inspect of %q: %w: %d values", bkey, errBadReply, len(raw))
	}
	nowUS, _ := raw[0].(int64)
	kv.StoreTime = time.UnixMicro(nowUS)
	if kv.Bucket, err = bucketView(bkey, raw[1], lim, nowUS); err != nil {
		return kv, err
	}
	if lim.HasQuota() {
		v, pttl, err := pair(raw[2])
		if err != nil {
			return kv, fmt.Errorf("quota %q: %w", qkey, err)
		}
		var used int64
		if v != "" {
			if _, err := fmt.Sscan(v, &used); err != nil {
				return kv, fmt.Errorf("quota %q: %q is not a count", qkey, v)
			}
		}
		_, end := lim.QuotaPeriod.Window(kv.StoreTime)
		kv.Quota = &QuotaView{RedisKey: qkey, Limit: lim.QuotaLimit, Used: used, Left: max(0, lim.QuotaLimit-used),
			Period: lim.QuotaPeriod.String(), ResetAt: end, TTLms: pttl}
	}
	if list, ok := raw[len(raw)-1].([]any); ok {
		for _, r := range list {
			if s, ok := r.(string); ok {
				kv.Resets = append(kv.Resets, json.RawMessage(s))
			}
		}
	}
	if lim.Split > 1 {
		sub := split.SubLimit(lim)
		for i := range lim.Split {
			sk := split.SubKey(key, i)
			skey := s.BucketKey(sk, scope)
			raw, err := inspectScript.run(ctx, s.rdb, []string{skey, keyslot.ResetLogKey(s.prefix, sk)}, 1).Slice()
			if err != nil {
				return kv, fmt.Errorf("redis inspect of %q: %w", skey, err)
			}
			if len(raw) != 3 {
				return kv, fmt.Errorf("redis inspect of %q: %w", skey, errBadReply)
			}
			now, _ := raw[0].(int64)
			b, err := bucketView(skey, raw[1], sub, now)
			if err != nil {
				return kv, err
			}
			kv.Split = append(kv.Split, b)
		}
	}
	return kv, nil
}

// ReservationView is one open reservation of a key: its estimate, spent
// from the bucket when it was made and settled against the actual cost,
// and when its record expires (an unsettled reservation stays charged at
// its estimate). Gone: the index lists it and its record is not there
// (evicted).
type ReservationView struct {
	ID        string    `json:"id"`
	Tokens    float64   `json:"tokens"`
	ExpiresAt time.Time `json:"expiresAt"`
	Gone      bool      `json:"gone,omitempty"`
}

// OpenReservations reads key's open reservations from its index
// (keyslot.ReservationIndexKey), soonest to expire first: at most n of
// them, and how many are open in all. A reservation made while the store
// could not be asked has no record and is not listed.
func (s *Store) OpenReservations(ctx context.Context, key string, n int) (open int64, list []ReservationView, err error) {
	idx := keyslot.ReservationIndexKey(s.prefix, key)
	raw, err := openScript.run(ctx, s.rdb, []string{idx}, max(1, n)).Slice()
	if err != nil {
		return 0, nil, fmt.Errorf("redis open reservations of %q: %w", idx, err)
	}
	if len(raw) < 2 {
		return 0, nil, fmt.Errorf("redis open reservations of %q: %w", idx, errBadReply)
	}
	open, _ = raw[1].(int64)
	for _, x := range raw[2:] {
		e, ok := x.([]any)
		if !ok || len(e) != 3 {
			return 0, nil, fmt.Errorf("redis open reservations of %q: %w", idx, errBadReply)
		}
		id, _ := e[0].(string)
		ms, _ := e[1].(int64)
		rv := ReservationView{ID: id, ExpiresAt: time.UnixMilli(ms)}
		rec, _ := e[2].(string)
		switch {
		case len(rec) >= 9 && rec[0] == 'r':
			rv.Tokens = math.Float64frombits(binary.LittleEndian.Uint64([]byte(rec[1:9])))
		default:
			rv.Gone = true
		}
		list = append(list, rv)
	}
	return open, list, nil
}

// pair reads one { value or nil, pttl } of inspect.lua.
func pair(x any) (string, int64, error) {
	p, ok := x.([]any)
	if !ok || len(p) != 2 {
		return "", 0, errBadReply
	}
	v, _ := p[0].(string)
	pttl, _ := p[1].(int64)
	return v, pttl, nil
}

// bucketView is a bucket's stored value refilled to the store's clock.
func bucketView(redisKey string, x any, lim enforcement.Limit, nowUS int64) (BucketView, error) {
	v, pttl, err := pair(x)
	if err != nil {
		return BucketView{}, fmt.Errorf("bucket %q: %w", redisKey, err)
	}
	bv := BucketView{RedisKey: redisKey, Capacity: lim.Burst, Rate: lim.Rate, Tokens: float64(lim.Burst), TTLms: max(0, pttl)}
	if pttl == -1 {
		bv.TTLms = -1
	}
	if v != "" {
		b, err := DecodeBucket(v)
		if err != nil {
			return BucketView{}, fmt.Errorf("bucket %q: %w", redisKey, err)
		}
		bv.Present = true
		elapsed := max(0, float64(nowUS-b.TS)) / 1e6
		bv.Tokens = math.Min(float64(lim.Burst), b.Tokens+elapsed*lim.Rate)
	}
	bv.Debt = max(0, -bv.Tokens)
	wait := 0.0
	if lim.Rate > 0 {
		wait = (float64(lim.Burst) - bv.Tokens) / lim.Rate
	}
	bv.FullAt = time.UnixMicro(nowUS).Add(time.Duration(wait * float64(time.Second)))
	return bv, nil
}

// ResetOp is what a reset does.
type ResetOp string

// Reset operations.
const (
	ResetRefill    ResetOp = "refill"     // the bucket full
	ResetGrant     ResetOp = "grant"      // N tokens more, up to the capacity
	ResetClearDebt ResetOp = "clear-debt" // a bucket below zero back to zero
	ResetQuota     ResetOp = "quota"      // the quota window's count back to zero
)

// Valid reports whether op is one of the reset operations.
func (op ResetOp) Valid() bool {
	switch op {
	case ResetRefill, ResetGrant, ResetClearDebt, ResetQuota:
		return true
	}
	return false
}

// ErrResetApplied: the reset's id was applied before; nothing changed.
var ErrResetApplied = errors.New("this reset was applied before")

// Reset applies op to (key, scope) under lim, pushes audit (a JSON object,
// to which the script adds "before" and "after") on the key's audit list
// and announces the reset on keyslot.ResetChannel, in one script. It
// returns the audit record as stored. id makes a reset sent twice apply
// once (ErrResetApplied).
func (s *Store) Reset(ctx context.Context, key, scope string, lim enforcement.Limit, op ResetOp, grant int64, id string, audit []byte) (json.RawMessage, error) {
	if !op.Valid() {
		return nil, fmt.Errorf("reset: unknown operation %q", op)
	}
	bkey, qkey, _ := s.callKeys(key, scope, lim)
	keys := []string{bkey, qkey, keyslot.ResetLogKey(s.prefix, key), keyslot.ResetMarkKey(s.prefix, key, id)}
	res, err := resetScript.run(ctx, s.rdb, keys, lim.Rate, lim.Burst, string(op), grant, string(audit),
		keyslot.ResetChannel(s.prefix), AnnounceReset(key, scope), ResetsKept).Result()
	if errors.Is(err, redis.Nil) {
		return nil, ErrResetApplied
	}
	if err != nil {
		return nil, fmt.Errorf("redis reset of %q: %w", bkey, err)
	}
	rec, ok := res.(string)
	if !ok {
		return nil, fmt.Errorf("redis reset of %q: %w", bkey, errBadReply)
	}
	return json.RawMessage(rec), nil
}

// Audit pushes an audit record on key's list without resetting anything:
// a refused reset is recorded too.
func (s *Store) Audit(ctx context.Context, key string, audit []byte) error {
	err := auditScript.run(ctx, s.rdb, []string{keyslot.ResetLogKey(s.prefix, key)}, string(audit), ResetsKept).Err()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("redis reset audit of %q: %w", key, err)
	}
	return nil
}

// AnnounceReset is the message a reset of (key, scope) is announced with
// on keyslot.ResetChannel; ParseAnnouncement reads it back.
func AnnounceReset(key, scope string) string { return scope + "\x00" + key }

// ParseAnnouncement is AnnounceReset's inverse.
func ParseAnnouncement(msg string) (key, scope string, ok bool) {
	for i := 0; i < len(msg); i++ {
		if msg[i] == 0 {
			return msg[i+1:], msg[:i], true
		}
	}
	return "", "", false
}
