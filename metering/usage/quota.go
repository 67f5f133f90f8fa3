package usage

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/limits"
	"github.com/ratewarden/ratewarden/metering/quotause"
	"github.com/ratewarden/ratewarden/policy"

	"github.com/ratewarden/ratewarden/schema"
)

// The quota view (GET /v1/quota) reads the policy through package policy —
// the limiter's own resolution — and the usage through package quotause, the
// attribution the reconciler restores Redis from. So the quota a customer is
// shown is the one the limiter enforces, and "used" is the number the
// reconciler would write back after a Redis loss.
//
// A quota is resolved per (key, scope, tier) and counted per (key, QuotaID).
// The view answers for one resolution — scope= and tier= when given, else
// the key-wide one (no scope, the key's tier from the keys map or
// default_tier), which is what every scope without a scope-specific rule
// gets — in "quota", and lists in "quotas" every counter the key spends in
// the current window: that one, and each one a (scope, tier) recorded in the
// rollups this month resolves to.

var quotaParamNames = map[string]bool{"key": true, "scope": true, "tier": true}

type quotaResponse struct {
	Key       string      `json:"key"`
	Tier      string      `json:"tier"`
	Scope     string      `json:"scope,omitempty"`
	Quota     *quotaInfo  `json:"quota"`  // the resolution's quota; null when it has none
	Quotas    []quotaInfo `json:"quotas"` // every quota counter of the key in its current window
	SoftLimit softLimit   `json:"softLimit"`
}

type quotaInfo struct {
	QuotaID     string      `json:"quotaId"` // tier:<name> | rule:<name>: the counter
	Rule        string      `json:"rule"`    // the tier or rule that sets the quota
	Policy      string      `json:"policy,omitempty"`
	Source      string      `json:"source"` // "tier" | "rule <name>"
	Limit       uint64      `json:"limit"`
	Period      string      `json:"period"`
	PeriodStart string      `json:"periodStart"`
	ResetsAt    string      `json:"resetsAt"`
	Used        uint64      `json:"used"`
	Remaining   uint64      `json:"remaining"`
	PercentUsed float64     `json:"percentUsed"`
	DryRun      bool        `json:"dryRun"`
	Scopes      []string    `json:"scopes"`
	Redis       *redisQuota `json:"redis"` // what the limiter enforces; null when unknown
	Consistency consistency `json:"consistency"`
}

// redisQuota is the counter as the limiter sees it.
type redisQuota struct {
	Used      uint64 `json:"used"`
	Remaining uint64 `json:"remaining"`
	Present   bool   `json:"present"` // false: no counter in Redis (never spent, or lost)
}

// consistency compares the usage record with Redis.
type consistency struct {
	State      string `json:"state"`      // agree | redis_behind | redis_ahead | unknown
	Difference int64  `json:"difference"` // Redis − record, tokens
	Message    string `json:"message"`
}

type softLimit struct {
	Percent          float64 `json:"percent"` // 0 = none
	State            string  `json:"state"`   // none | ok | warning
	WarningsLastHour uint64  `json:"warningsLastHour"`
}

// getQuota answers GET /v1/quota (see the comment at the top of this file).
func (s *Server) getQuota(c *gin.Context) {
	var p problems
	single := singles(c.Request.URL.Query(), quotaParamNames, &p)
	for _, name := range []string{"key", "scope", "tier"} {
		if v, ok := single[name]; ok {
			if msg := checkText(v, MaxKeyLen); msg != "" {
				p.add("%s %s", name, msg)
			}
		}
	}
	if err := p.err(); err != nil {
		fail(c, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	key, ok := resolveKey(c, single["key"])
	if !ok {
		return
	}
	if s.policy == nil {
		fail(c, http.StatusServiceUnavailable, "policy_unavailable", "no policy file is configured")
		return
	}
	pol, err := s.policy.Get()
	if err != nil {
		s.log.Warn("quota: no policy", "err", err)
		fail(c, http.StatusServiceUnavailable, "policy_unavailable", "the policy file cannot be read")
		return
	}
	scope := single["scope"]
	view, err := pol.Resolve(key, scope, single["tier"])
	if errors.Is(err, limits.ErrUnknownTier) {
		fail(c, http.StatusBadRequest, "invalid_request", "tier "+single["tier"]+" is not in the policy")
		return
	}
	if err != nil {
		s.storeFail(c, err)
		return
	}

	now := s.now().UTC()
	ctx, cancel := s.queryCtx(c)
	defer cancel()
	resp := quotaResponse{Key: key, Tier: view.Tier, Scope: scope, Quotas: []quotaInfo{},
		SoftLimit: softLimit{Percent: view.SoftLimitPercent, State: "none"}}
	lastHour, err := s.cfg.Store.totals(ctx, totalsQuery{db: s.cfg.Store.db, table: schema.UsageMinute, key: key,
		from: now.Add(-time.Hour).Truncate(time.Minute), to: now.Truncate(time.Minute).Add(time.Minute)})
	if err != nil {
		s.storeFail(c, err)
		return
	}
	resp.SoftLimit.WarningsLastHour = lastHour.Warnings

	rows, err := s.quotaRows.Rows(ctx, now, key)
	if err != nil {
		s.storeFail(c, wrap("quota usage", err))
		return
	}
	counters, _ := quotause.Attribute(pol, rows, now)
	if view.HasQuota() {
		q := quotause.For(key, view, counters, now)
		if !containsCounter(counters, q.QuotaID) {
			counters = append(counters, q)
		}
		// The view's own counter first, the others by QuotaID.
		sort.SliceStable(counters, func(i, j int) bool { return counters[i].QuotaID == view.QuotaID && counters[j].QuotaID != view.QuotaID })
	}
	enforced := s.redisCounters(ctx, counters)
	for i, q := range counters {
		qi := quotaInfoOf(q, enforced[i])
		if q.QuotaID == view.QuotaID && view.HasQuota() {
			qi.Policy, qi.DryRun = view.Policy, view.DryRun
			resp.Quota = &qi
		}
		resp.Quotas = append(resp.Quotas, qi)
	}
	if view.SoftLimitPercent > 0 || lastHour.Warnings > 0 {
		resp.SoftLimit.State = "ok"
		if lastHour.Warnings > 0 || (resp.Quota != nil && limits.SoftLimitReached(float64(resp.Quota.Used), float64(resp.Quota.Limit), view.SoftLimitPercent)) {
			resp.SoftLimit.State = "warning"
		}
	}
	c.JSON(http.StatusOK, resp)
}

func containsCounter(qs []quotause.Quota, id string) bool {
	for _, q := range qs {
		if q.QuotaID == id {
			return true
		}
	}
	return false
}

// enforcedCounter is one counter read from Redis.
type enforcedCounter struct {
	known   bool // Redis was asked and answered
	present bool
	used    int64
	err     string // why not known
}

// redisCounters reads the counters from Redis in one pipeline under the
// query deadline (at most RedisTimeout). Without Redis, or when it cannot
// be asked, every counter is unknown and the view says so.
func (s *Server) redisCounters(ctx context.Context, qs []quotause.Quota) []enforcedCounter {
	out := make([]enforcedCounter, len(qs))
	if len(qs) == 0 {
		return out
	}
	if s.cfg.Redis == nil {
		for i := range out {
			out[i].err = "Redis is not configured for the usage API (REDIS_ADDRS), so the enforced count is not shown"
		}
		return out
	}
	rctx, cancel := context.WithTimeout(ctx, s.cfg.RedisTimeout)
	defer cancel()
	cmds := make([]*redis.StringCmd, len(qs))
	_, err := s.cfg.Redis.Pipelined(rctx, func(p redis.Pipeliner) error {
		for i, q := range qs {
			cmds[i] = p.Get(rctx, q.RedisKey(s.cfg.KeyPrefix))
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		s.log.Warn("quota: Redis cannot be read", "err", err)
	}
	for i, cmd := range cmds {
		v, err := cmd.Int64()
		switch {
		case err == nil:
			out[i] = enforcedCounter{known: true, present: true, used: v}
		case errors.Is(err, redis.Nil):
			out[i] = enforcedCounter{known: true}
		default:
			out[i].err = "Redis could not be asked: " + err.Error()
		}
	}
	return out
}

func quotaInfoOf(q quotause.Quota, e enforcedCounter) quotaInfo {
	name, kind := q.QuotaID, "tier"
	if n, ok := strings.CutPrefix(q.QuotaID, "tier:"); ok {
		name = n
	} else if n, ok := strings.CutPrefix(q.QuotaID, "rule:"); ok {
		name, kind = n, "rule "+n
	}
	limit := uint64(q.Limit)
	qi := quotaInfo{QuotaID: q.QuotaID, Rule: name, Source: kind, Limit: limit, Period: q.Period.String(),
		PeriodStart: q.Start.Format(time.RFC3339), ResetsAt: q.End.Format(time.RFC3339),
		Used: q.Used, Remaining: sub0(limit, q.Used), Scopes: q.Scopes}
	if qi.Scopes == nil {
		qi.Scopes = []string{}
	}
	if limit > 0 {
		qi.PercentUsed = float64(q.Used) * 100 / float64(limit)
	}
	if !e.known {
		qi.Consistency = consistency{State: "unknown", Message: e.err}
		return qi
	}
	used := uint64(max(0, e.used))
	qi.Redis = &redisQuota{Used: used, Remaining: sub0(limit, used), Present: e.present}
	diff := int64(used) - int64(q.Used)
	qi.Consistency.Difference = diff
	switch {
	case diff == 0:
		qi.Consistency.State, qi.Consistency.Message = "agree", "The limiter's counter in Redis and the usage record agree."
	case diff < 0:
		lost := "part of its count"
		if !e.present {
			lost = "its counter"
		}
		// What the limiter may admit beyond the quota before the counter is
		// restored: the lost count, or all the counter still lets through.
		over := min(uint64(-diff), qi.Redis.Remaining)
		qi.Consistency.State = "redis_behind"
		qi.Consistency.Message = fmt.Sprintf("Redis counts %d fewer tokens than the usage record: it has lost %s "+
			"(a restart, failover or eviction). The reconciler restores it within one interval (METER_RECONCILE_EVERY); "+
			"until then up to %d tokens more than the quota allows may be admitted.", -diff, lost, over)
	default:
		qi.Consistency.State = "redis_ahead"
		qi.Consistency.Message = fmt.Sprintf("Redis counts %d more tokens than the usage record: decisions not yet in the "+
			"record (metering lag) or never metered. The limiter enforces Redis's count.", diff)
	}
	return qi
}

func sub0(a, b uint64) uint64 {
	if b >= a {
		return 0
	}
	return a - b
}

// newPolicy is the policy the quota view reads, or nil without a path.
func newPolicy(path string, s *Server) *policy.Current {
	if path == "" {
		return nil
	}
	return policy.NewCurrent(path, func(err error) {
		s.log.Warn("policy file refused; keeping the previous one", "path", path, "err", err)
	})
}
