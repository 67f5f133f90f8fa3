package support

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/ratewarden/ratewarden/enforcement/global"
	"github.com/ratewarden/ratewarden/enforcement/keyslot"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/policylog"
)

// DefaultPartTimeout is how long inspect waits for one part (a limiter,
// the store, ClickHouse) before marking it unread.
const DefaultPartTimeout = 500 * time.Millisecond

// Inspector reads one key's whole state. Its zero value reads nothing;
// each source left nil is reported as not configured. Safe for concurrent
// use.
type Inspector struct {
	// Limiters are the fleet's base URLs (LIMITER_FLEET_URLS), asked for
	// their local view with Token (LIMITER_AUTH_TOKEN) as bearer.
	Limiters []string
	Token    string
	HTTP     *http.Client
	// Store is the default shared store (REDIS_ADDRS); Prefix its key
	// prefix, only to name where a part lives.
	Store  *redisstore.Store
	Prefix string
	// Stores are REDIS_STORES's, by name.
	Stores map[string]*redisstore.Store
	// ClickHouse and Database hold decisions_raw (CLICKHOUSE_*).
	ClickHouse driver.Conn
	Database   string
	// FallbackRule resolves the rule when no limiter answers (POLICY_FILE);
	// nil = none.
	FallbackRule func(key, scope string) (*Rule, error)
	// Timeout bounds each part (default DefaultPartTimeout).
	Timeout time.Duration
	// Decisions is how many recorded decisions to show (default 20).
	Decisions int
	// OverrideRecord, optional, reads the policy log's record of the
	// override in force for key and scope (scope "" = the whole key's),
	// for an override whose limiter did not name its author and reason.
	// Nil = such an override names its revision only.
	OverrideRecord func(ctx context.Context, key, scope string) (policylog.Record, bool, error)
}

func (in *Inspector) timeout() time.Duration {
	if in.Timeout > 0 {
		return in.Timeout
	}
	return DefaultPartTimeout
}

// Inspect reads key and scope: the fleet's views (and the rule they
// resolve) first, then the store and ClickHouse at once. It always
// answers; a part that could not be read says why.
func (in *Inspector) Inspect(ctx context.Context, key, scope string) Report {
	rep := Report{Key: key, Scope: scope, At: time.Now().UTC(), Resets: []json.RawMessage{}, Limiters: []LimiterPart{}}
	rep.Limiters = in.askFleet(ctx, key, scope)
	rep.Rule = in.ruleOf(rep.Limiters, key, scope)
	if rep.Rule.Rule != nil && rep.Rule.Global {
		rep.Global = globalOf(rep.Limiters)
	}
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); in.readStore(ctx, &rep) }()
	go func() { defer wg.Done(); in.readDecisions(ctx, &rep) }()
	go func() { defer wg.Done(); in.readOverride(ctx, &rep) }()
	wg.Wait()
	return rep
}

// ruleOf is the rule of the first limiter of ls that named one, else
// FallbackRule's.
func (in *Inspector) ruleOf(ls []LimiterPart, key, scope string) RulePart {
	for _, l := range ls {
		if l.LocalAnswer != nil && l.LocalAnswer.Rule != nil {
			r := *l.LocalAnswer.Rule
			r.From = l.URL
			return RulePart{Part: Part{Where: "limiter " + l.URL}, Rule: &r}
		}
	}
	rp := RulePart{Part: Part{Where: "the fleet's limiters (LIMITER_FLEET_URLS)"}}
	if in.FallbackRule == nil {
		rp.Error = "no limiter answered and POLICY_FILE is not set"
		return rp
	}
	r, err := in.FallbackRule(key, scope)
	if err != nil {
		rp.Error = err.Error()
		return rp
	}
	return RulePart{Part: Part{Where: "POLICY_FILE " + r.From}, Rule: r}
}

// storeOf is the store a key's limit names (default: Store); nil when
// that store is not configured here.
func (in *Inspector) storeOf(ctx context.Context, key, scope string) *redisstore.Store {
	rp := in.ruleOf(in.askFleet(ctx, key, scope), key, scope)
	if rp.Rule == nil || rp.Limit.Store == "" {
		return in.Store
	}
	return in.Stores[rp.Limit.Store]
}

// globalOf assembles a global key's budget from the fleet's answers: one
// pool per region (its first limiter's read), the home's bucket from the
// first limiter that read it.
func globalOf(ls []LimiterPart) *GlobalPart {
	g := &GlobalPart{Part: Part{Where: "each region's Redis (its pool) and the home's (GLOBAL_REDIS_ADDRS: the global bucket), read by the fleet's limiters"},
		Pools: []PoolPart{}}
	seen := map[string]bool{}
	for _, l := range ls {
		if l.LocalAnswer == nil || l.LocalAnswer.Global == nil {
			continue
		}
		v := l.LocalAnswer.Global
		if !seen[v.Pool.Region] {
			seen[v.Pool.Region] = true
			g.Pools = append(g.Pools, PoolPart{PoolView: v.Pool, From: l.URL, Error: v.PoolError})
		}
		if g.Bucket == nil && v.Bucket != nil {
			g.Bucket, g.BucketWhere, g.BucketError = v.Bucket, v.BucketWhere+" (read by "+l.URL+")", ""
		} else if g.Bucket == nil && g.BucketError == "" {
			g.BucketWhere, g.BucketError = v.BucketWhere, v.BucketError
		}
	}
	if len(g.Pools) == 0 {
		g.Error = "no limiter of the fleet read it: a limiter reads its region's pool and the home's bucket when LIMITER_REGION and GLOBAL_REDIS_ADDRS are set (LIMITER_FLEET_URLS names the limiters asked)"
		return g
	}
	// The regions the answers name (LIMITER_REGIONS) whose pool no
	// limiter read are listed, marked.
	for _, l := range ls {
		if l.LocalAnswer == nil || l.LocalAnswer.Global == nil {
			continue
		}
		for _, name := range l.LocalAnswer.Global.Regions {
			if !seen[name] {
				seen[name] = true
				g.Pools = append(g.Pools, PoolPart{PoolView: global.PoolView{Region: name}, Error: "not read: no limiter of region " + name + " answered (LIMITER_FLEET_URLS names the limiters asked)"})
			}
		}
	}
	return g
}

// readOverride fills the author, reason and message of the override in
// force from the policy log, within the part timeout, when the limiter
// that named it did not (an override it read from its policy cache, or a
// limiter that does not keep them).
func (in *Inspector) readOverride(ctx context.Context, rep *Report) {
	if rep.Rule.Rule == nil || rep.Rule.Override == nil || rep.Rule.Override.Reason != "" {
		return
	}
	ov := *rep.Rule.Override // the rule is a copy; its override is the limiter's answer's
	rep.Rule.Override = &ov
	if in.OverrideRecord == nil {
		ov.RecordError = "the policy log is not read here (KAFKA_BROKERS): `limiter override get " + ov.Key + "` shows its author and reason"
		return
	}
	octx, cancel := context.WithTimeout(ctx, in.timeout())
	defer cancel()
	rec, ok, err := in.OverrideRecord(octx, ov.Key, ov.Scope)
	switch {
	case err != nil:
		ov.RecordError = "policy log: " + err.Error()
	case !ok:
		ov.RecordError = fmt.Sprintf("the policy log has no override of %s (scope %q) in force: deleted since revision %d?", ov.Key, ov.Scope, ov.Revision)
	default:
		ov.Author, ov.Message = rec.Author, rec.Message
		if rec.Override != nil {
			ov.Reason = rec.Override.Reason
		}
		if rec.Revision != ov.Revision {
			ov.RecordError = fmt.Sprintf("the log's override is revision %d; the limiter applied revision %d", rec.Revision, ov.Revision)
		}
	}
}

// readStore fills the store's parts: bucket, quota, debt, split, resets.
func (in *Inspector) readStore(ctx context.Context, rep *Report) {
	key, scope := rep.Key, rep.Scope
	where := "redis " + keyslot.BucketKey(in.prefix(), key, scope)
	rep.Bucket.Where, rep.Debt.Where = where, where
	rep.Reservations = ReservationsPart{Part: Part{Where: "redis " + keyslot.ReservationIndexKey(in.prefix(), key)},
		Note: "each reservation's estimate is spent from its bucket; one not settled by its expiry stays charged at its estimate"}
	fail := func(msg string) {
		rep.Bucket.Error, rep.Debt.Error, rep.ResetsError, rep.Reservations.Error = msg, msg, msg, msg
		if rep.Quota != nil {
			rep.Quota.Error = msg
		}
		if rep.Split != nil {
			rep.Split.Error = msg
		}
	}
	r := rep.Rule.Rule
	if r == nil {
		fail("the rule is unknown, so the bucket cannot be named: " + rep.Rule.Error)
		return
	}
	lim := r.Limit
	if lim.HasQuota() {
		rep.Quota = &QuotaPart{Part: Part{Where: "redis (limits.QuotaKey) of quota " + lim.QuotaID}}
	}
	if lim.Split > 1 {
		rep.Split = &SplitPart{Part: Part{Where: fmt.Sprintf("redis, %d sub-keys %s#0…#%d", lim.Split, key, lim.Split-1)}}
	}
	st := in.Store
	if lim.Store != "" {
		st = in.Stores[lim.Store]
	}
	if st == nil {
		fail(fmt.Sprintf("no store %q configured here (REDIS_ADDRS, REDIS_STORES)", lim.Store))
		return
	}
	sctx, cancel := context.WithTimeout(ctx, in.timeout())
	defer cancel()
	kv, err := st.Inspect(sctx, key, scope, lim, 20)
	if err != nil {
		fail(err.Error())
		return
	}
	rep.Bucket.BucketView, rep.Bucket.StoreTime = &kv.Bucket, kv.StoreTime
	rep.Debt.Tokens = kv.Bucket.Debt
	if kv.Quota != nil && rep.Quota != nil {
		rep.Quota.QuotaView, rep.Quota.Where = kv.Quota, "redis "+kv.Quota.RedisKey
	}
	if rep.Split != nil {
		rep.Split.Buckets = kv.Split
	}
	rep.Resets = append(rep.Resets, kv.Resets...)
	if r.Global {
		rep.Reservations.Error = "a global key's reservations are recorded in its region's pools, not indexed per key"
		return
	}
	total, open, err := st.OpenReservations(sctx, key, MaxReservationsListed)
	if err != nil {
		rep.Reservations.Error = err.Error()
		return
	}
	rep.Reservations.Total, rep.Reservations.Open = total, open
}

func (in *Inspector) prefix() string {
	if in.Prefix == "" {
		return "rl"
	}
	return in.Prefix
}

// askFleet asks every limiter for its view at once, each within the
// part timeout.
func (in *Inspector) askFleet(ctx context.Context, key, scope string) []LimiterPart {
	out := make([]LimiterPart, len(in.Limiters))
	var wg sync.WaitGroup
	for i, u := range in.Limiters {
		out[i] = LimiterPart{URL: u, Part: Part{Where: u + "/admin/keys/local"}}
		wg.Add(1)
		go func(p *LimiterPart) {
			defer wg.Done()
			a, err := in.askOne(ctx, p.URL, key, scope)
			if err != nil {
				p.Error = err.Error()
				return
			}
			p.LocalAnswer = a
		}(&out[i])
	}
	wg.Wait()
	return out
}

func (in *Inspector) askOne(ctx context.Context, base, key, scope string) (*LocalAnswer, error) {
	ctx, cancel := context.WithTimeout(ctx, in.timeout())
	defer cancel()
	q := url.Values{"key": {key}, "scope": {scope}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(base, "/")+"/admin/keys/local?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	if in.Token != "" {
		req.Header.Set("Authorization", "Bearer "+in.Token)
	}
	hc := in.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	var a LocalAnswer
	if err := json.Unmarshal(body, &a); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	return &a, nil
}

// readDecisions fills the recorded decisions and webhooks from
// ClickHouse, both within one part deadline.
func (in *Inspector) readDecisions(ctx context.Context, rep *Report) {
	rep.Decisions.Rows, rep.Webhooks.Rows = []Decision{}, []Webhook{}
	q := recentQuery{Database: in.Database, Key: rep.Key, Scope: rep.Scope, Limit: in.Decisions}
	w := webhookQuery{Database: in.Database, Key: rep.Key}
	rep.Decisions.Where, rep.Webhooks.Where = "clickhouse "+q.table(), "clickhouse "+w.table()
	if in.ClickHouse == nil {
		rep.Decisions.Error = "ClickHouse is not configured here (CLICKHOUSE_ADDR)"
		rep.Webhooks.Error = rep.Decisions.Error
		return
	}
	cctx, cancel := context.WithTimeout(ctx, in.timeout())
	defer cancel()
	explain := func(err error) string {
		if errors.Is(cctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("no answer within %v: %w", in.timeout(), err)
		}
		return err.Error()
	}
	if rows, err := q.run(cctx, in.ClickHouse); err != nil {
		rep.Decisions.Error = explain(err)
	} else {
		rep.Decisions.Rows = rows
	}
	if rows, err := w.run(cctx, in.ClickHouse); err != nil {
		rep.Webhooks.Error = explain(err)
	} else {
		rep.Webhooks.Rows = rows
	}
}
