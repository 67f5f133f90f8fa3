package global

import (
	"context"
	_ "embed"
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
)

//go:embed poolread.lua
var poolReadLua string

// poolReadScript reads a pool without writing (inspect).
var poolReadScript = redisstore.NewScript(poolReadLua)

// PoolView is one region's pool of a global key's budget, as stored in the
// region's Redis (pool.lua's seven doubles), for support's inspect.
type PoolView struct {
	Region   string `json:"region"`
	RedisKey string `json:"redisKey"`
	// Present is false when the region holds no pool of the key (never
	// asked, or given back and expired): every field below is then zero.
	Present bool `json:"present"`
	// Tokens leased from the global bucket and not yet spent; Debt is
	// what the region owes the global bucket (tokens below zero).
	Tokens float64 `json:"tokens"`
	Debt   float64 `json:"debt"`
	// Wanted and Spent are every cost asked of the pool and allowed,
	// since it was created.
	Wanted float64 `json:"wanted"`
	Spent  float64 `json:"spent"`
	// Escrow is the escrow bucket's tokens (what the region decides on
	// while the home is unreachable); Owed what it spent there not yet
	// charged to the home's quota; QuotaUsed the key's quota as the home
	// last counted it.
	Escrow float64 `json:"escrow"`
	// EscrowUsed is false while the escrow was never spent (it is full,
	// whatever Escrow says).
	EscrowUsed bool    `json:"escrowUsed"`
	Owed       float64 `json:"owed"`
	QuotaUsed  float64 `json:"quotaUsed"`
	// HomeTokens is the region's view of the global bucket (whole tokens
	// after the refiller's latest lease there) and when it learned it;
	// zero when it has none.
	HomeTokens float64   `json:"homeTokens"`
	HomeAt     time.Time `json:"homeAt,omitzero"`
	TTLms      int64     `json:"ttlMs"`
}

// View is what one region reads of a global key: its pool, and the
// global bucket at the home. Each part that could not be read carries
// its error instead.
type View struct {
	// Regions are every region sharing the key's global limit, as this
	// region's configuration names them (the caller sets it; nil =
	// unknown): which pools there are to read.
	Regions     []string               `json:"regions,omitempty"`
	Pool        PoolView               `json:"pool"`
	PoolError   string                 `json:"poolError,omitempty"`
	Bucket      *redisstore.BucketView `json:"bucket,omitempty"`
	BucketWhere string                 `json:"bucketWhere"`
	BucketError string                 `json:"bucketError,omitempty"`
}

// Inspect reads key and scope's pool in this region and its global bucket
// at the home (lim is the global limit), writing nothing: the region's
// Redis within ctx, the home within ctx and HomeTimeout.
func (g *Global) Inspect(ctx context.Context, key, scope string, lim enforcement.Limit) View {
	v := View{Pool: PoolView{Region: g.cfg.Region, RedisKey: g.poolKey(key, scope)},
		BucketWhere: "the home's Redis (GLOBAL_REDIS_ADDRS) " + g.home.BucketKey(key, scope)}
	if p, err := g.readPool(ctx, key, scope); err != nil {
		v.PoolError = err.Error()
	} else {
		v.Pool = p
	}
	hctx, cancel := context.WithTimeout(ctx, g.cfg.HomeTimeout)
	defer cancel()
	kv, err := g.home.Inspect(hctx, key, scope, lim, 1)
	if err != nil {
		v.BucketError = err.Error()
	} else {
		v.Bucket = &kv.Bucket
	}
	return v
}

func (g *Global) readPool(ctx context.Context, key, scope string) (PoolView, error) {
	p := PoolView{Region: g.cfg.Region, RedisKey: g.poolKey(key, scope)}
	raw, err := poolReadScript.Run(ctx, g.cfg.Local, []string{p.RedisKey, g.viewKey(key, scope)}).Slice()
	if err != nil {
		return p, fmt.Errorf("redis pool %s: %w", p.RedisKey, err)
	}
	if len(raw) != 3 {
		return p, fmt.Errorf("redis pool %s: %d values, want 3", p.RedisKey, len(raw))
	}
	if s, ok := raw[0].(string); ok {
		f, err := doubles(s, 7)
		if err != nil {
			return p, fmt.Errorf("redis pool %s: %w", p.RedisKey, err)
		}
		p.Present = true
		p.Tokens, p.Wanted, p.Spent, p.Escrow, p.EscrowUsed, p.QuotaUsed, p.Owed = f[0], f[1], f[2], f[3], f[4] != 0, f[5], f[6]
		p.Debt = max(0, -p.Tokens)
	}
	if ttl, ok := raw[1].(int64); ok && ttl > 0 {
		p.TTLms = ttl
	}
	if s, ok := raw[2].(string); ok {
		if f, err := doubles(s, 2); err == nil {
			p.HomeTokens, p.HomeAt = f[0], time.UnixMicro(int64(f[1])).UTC()
		}
	}
	return p, nil
}

// doubles decodes n little-endian float64s (pool.lua's stored form).
func doubles(s string, n int) ([]float64, error) {
	if len(s) != 8*n {
		return nil, fmt.Errorf("%d bytes, want %d doubles", len(s), n)
	}
	out := make([]float64, n)
	for i := range out {
		out[i] = math.Float64frombits(binary.LittleEndian.Uint64([]byte(s[8*i : 8*i+8])))
	}
	return out, nil
}
