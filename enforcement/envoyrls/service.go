// Package envoyrls serves the Envoy rate limit service API
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) over the
// limiter: each descriptor of a RateLimitRequest becomes a key and a scope
// through the policy file's `domains` section, is decided by
// Limiter.Check exactly as a POST /check of that key and scope would be,
// and the Decisions become the response Envoy understands.
//
// It is transport only: the decision, its tiers and its failure policy are
// the enforcement package's; the mapping is the policy package's.
//
// A request with several descriptors is decided descriptor by descriptor,
// in the order Envoy sent them, and stops at the first that is over its
// limit: that one spends nothing (a rejection never spends), and the ones
// after it are not evaluated (status UNKNOWN), so they spend nothing
// either. The ones before it have spent: a refund would be a second write
// racing every other spender of those buckets, and would hand back tokens
// that concurrent requests were already refused for. Put the descriptors
// of the caller's own budgets first and shared (global) ones last, and a
// flood from one caller never reaches the shared budget (docs/policy.md).
//
// # Concurrency slots
//
// With SetSlots, a descriptor whose limit has a concurrency takes a slot,
// as POST /check does. Envoy cannot hold a lease id by itself, so the
// door hands it over in the answer's dynamic_metadata (LeaseMetadataKey,
// which Envoy keeps under the filter's namespace for the rest of the
// stream), and the route's stream-done rate limit reads it back into a
// descriptor entry (ReleaseEntryKey, a `metadata` action of source
// DYNAMIC): that call gives the slots back. A call answered OVER_LIMIT,
// or failing, gives back at once the slots it took: the request does not
// run. A stream-done call that never comes (Envoy killed, the call lost)
// leaves the slot to its lease, which nobody renews: it returns within
// the lease time, as a dead holder's does.
package envoyrls

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/httpapi"
	"github.com/ratewarden/ratewarden/enforcement/ratelimitheader"
	"github.com/ratewarden/ratewarden/enforcement/slots"
	"github.com/ratewarden/ratewarden/limits"
	"github.com/ratewarden/ratewarden/policy"
)

// Bounds of a request, beyond which it is refused with INVALID_ARGUMENT
// before anything is spent. The mapped key and scope have /check's bounds.
const (
	MaxDescriptors = 64
	MaxEntries     = 32
	MaxEntryBytes  = 4096 // an entry's key or value
	MaxKeyBytes    = limits.MaxKeyBytes
	MaxScopeBytes  = limits.MaxScopeBytes
	MaxCost        = limits.MaxCost
)

// Limiter is what the service needs of *enforcement.Limiter.
type Limiter interface {
	Check(ctx context.Context, req enforcement.Request) (enforcement.Decision, error)
	Policy() enforcement.Policy
}

// Charger is a Limiter that also charges costs known after the fact
// (*enforcement.Limiter is one): what a charge descriptor needs.
type Charger interface {
	Charge(ctx context.Context, req enforcement.Request) (enforcement.Settlement, error)
}

// ChargeEntryKey marks a descriptor as a charge: Envoy's rate limit sent
// when the stream is done (apply_on_stream_done), its hits_addend the cost
// the response reported (the tokens a completion used). A charge is spent
// whatever is left, into debt if need be, and always answered OK (Envoy
// ignores the answer to it). The entry is not mapped: the rest of the
// descriptor names the key and scope as at request time.
const ChargeEntryKey = "ratewarden.charge"

// Result is what became of one descriptor, for metrics.
type Result uint8

// Descriptor results (the `result` label of limiter_envoy_descriptors_total).
const (
	ResultOK            Result = iota // decided, allowed
	ResultOverLimit                   // decided, rejected
	ResultWouldReject                 // decided in dry run: allowed, but enforcement would have rejected
	ResultNoMatch                     // no mapping of the domain matches: OK, no limit
	ResultUnknownDomain               // the policy has no such domain: OK, no limit
	ResultNotEvaluated                // after a rejected descriptor: UNKNOWN, nothing spent
	ResultCostExceeds                 // the cost is larger than the bucket could ever hold: OVER_LIMIT
	ResultCharged                     // a charge descriptor (ChargeEntryKey): spent, OK
	ResultReleased                    // a release descriptor (ReleaseEntryKey): its leases given back, OK
	numResults
)

var resultNames = [numResults]string{"ok", "over_limit", "would_reject", "no_match", "unknown_domain", "not_evaluated", "cost_exceeds_limit", "charged", "released"}

// String is the metric label of r.
func (r Result) String() string {
	if r < numResults {
		return resultNames[r]
	}
	return "unknown"
}

// Results lists every Result, for metrics that pre-create their series.
func Results() []Result {
	out := make([]Result, numResults)
	for i := range out {
		out[i] = Result(i)
	}
	return out
}

// Observer counts descriptor results. It must be cheap and safe for concurrent use.
type Observer interface {
	Descriptor(domain string, r Result)
}

// Service implements rlsv3.RateLimitServiceServer.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer
	lim     Limiter
	slots   Slots // nil: the door takes no slots
	obs     Observer
	now     func() time.Time
	headers ratelimitheader.Mode
}

// New returns the service over lim. obs may be nil. Its answers carry the
// legacy headers only until SetHeaderMode says otherwise.
func New(lim Limiter, obs Observer) *Service {
	return &Service{lim: lim, obs: obs, now: time.Now, headers: ratelimitheader.Legacy}
}

// SetHeaderMode selects the response_headers_to_add of every answer:
// Legacy (the default: x-ratelimit-* and ratelimit-limit/-remaining/-reset),
// Draft (the IETF draft's ratelimit-policy and ratelimit), Both, or None;
// retry-after and the soft-limit warning are added in every mode. Call it
// before serving.
func (s *Service) SetHeaderMode(m ratelimitheader.Mode) { s.headers = m }

// plan is one descriptor, validated and mapped, before anything is spent.
type plan struct {
	mapped   policy.Mapped
	result   policy.MapResult
	cost     int64
	hasCost  bool
	charge   bool   // ChargeEntryKey: charge cost, decide nothing
	priority string // PriorityEntryKey's value
	release  bool   // ReleaseEntryKey: give leases back, decide nothing
	leases   string // ReleaseEntryKey's value
}

// ShouldRateLimit implements the Envoy rate limit service.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	domain := req.GetDomain()
	descs := req.GetDescriptors()
	switch {
	case domain == "":
		return nil, status.Error(codes.InvalidArgument, "domain is required")
	case len(domain) > MaxEntryBytes:
		return nil, status.Errorf(codes.InvalidArgument, "domain is %d bytes, at most %d", len(domain), MaxEntryBytes)
	case len(descs) == 0:
		return nil, status.Error(codes.InvalidArgument, "at least one descriptor is required")
	case len(descs) > MaxDescriptors:
		return nil, status.Errorf(codes.InvalidArgument, "%d descriptors, at most %d", len(descs), MaxDescriptors)
	}
	// The policy language's domains map descriptors to keys and scopes; a
	// policy of another kind knows no domain.
	mapper, _ := s.lim.Policy().(*policy.Policy)

	// Everything is validated and mapped before anything is spent: an
	// invalid descriptor refuses the whole request with nothing spent.
	var plansBuf [4]plan
	plans := plansBuf[:0]
	var entryBuf [8]policy.Entry
	for i, d := range descs {
		p, err := planOf(mapper, domain, req.GetHitsAddend(), d, entryBuf[:0])
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "descriptors[%d]: %v", i, err)
		}
		plans = append(plans, p)
	}

	a := newAnswer(len(plans))
	resp := &a.resp
	resp.OverallCode = rlsv3.RateLimitResponse_OK
	var (
		bind     enforcement.Decision // the decision the headers report
		bindSet  bool
		rejected bool
		warn     bool // some enforced descriptor reached its soft limit
		now      time.Time
		taken    []string // leases this call took
		reason   string   // a slot's reason for the rejection
	)
	check := s.lim.Check
	if s.slots != nil {
		check = s.slots.Check
	}
	answered := false
	defer func() {
		// A call that fails or is over the limit does not run: the
		// slots it took are given back now, not at the lease's end.
		if !answered || resp.OverallCode != rlsv3.RateLimitResponse_OK {
			s.giveBack(ctx, taken)
		}
	}()
	for i := range plans {
		p := &plans[i]
		st := resp.Statuses[i]
		if p.release {
			st.Code = rlsv3.RateLimitResponse_OK
			if err := s.release(ctx, p.leases, i); err != nil {
				return nil, err
			}
			s.observe(domain, ResultReleased)
			continue
		}
		switch {
		case p.result == policy.MapUnknownDomain:
			st.Code = rlsv3.RateLimitResponse_OK
			s.observe(domain, ResultUnknownDomain)
			continue
		case p.result == policy.MapNoMatch:
			st.Code = rlsv3.RateLimitResponse_OK
			s.observe(domain, ResultNoMatch)
			continue
		case rejected:
			st.Code = rlsv3.RateLimitResponse_UNKNOWN
			s.observe(domain, ResultNotEvaluated)
			continue
		}
		if p.charge {
			if err := s.charge(ctx, domain, p, st, a, i, mapper); err != nil {
				return nil, err
			}
			s.observe(domain, ResultCharged)
			continue
		}
		d, err := check(ctx, enforcement.Request{
			Key: p.mapped.Key, Scope: p.mapped.Scope, Tier: p.mapped.Tier,
			Cost: p.cost, HasCost: p.hasCost, Domain: domain, Priority: p.priority,
		})
		if d.Lease != "" {
			taken = append(taken, d.Lease)
		}
		if now.IsZero() {
			now = s.now()
		}
		if err != nil {
			switch {
			case ctx.Err() != nil:
				return nil, status.FromContextError(ctx.Err()).Err()
			case errors.Is(err, enforcement.ErrCostExceedsLimit):
				// It could never pass: over the limit, for good. Nothing
				// was spent or recorded.
				st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
				st.CurrentLimit = currentLimit(mapper, p.mapped, enforcement.Decision{}, a.limit(i))
				st.DurationUntilReset = a.duration(i, 0)
				rejected = true
				resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
				s.observe(domain, ResultCostExceeds)
				continue
			case errors.Is(err, enforcement.ErrUnknownTier), errors.Is(err, enforcement.ErrInvalidRequest), errors.Is(err, slots.ErrUnknownPriority):
				return nil, status.Errorf(codes.InvalidArgument, "descriptors[%d]: %v", i, err)
			case errors.Is(err, enforcement.ErrConcurrencyOnly):
				// This door takes no slots (SetSlots): Envoy's
				// failure_mode_deny decides what becomes of the request.
				return nil, status.Errorf(codes.FailedPrecondition, "descriptors[%d]: %v", i, err)
			}
			return nil, status.Errorf(codes.Internal, "descriptors[%d]: %v", i, err)
		}
		if p.hasCost && p.cost == 0 && !d.DryRun && d.Bucket.Rate > 0 {
			// hits_addend 0 asks "is this bucket in debt or empty?":
			// Envoy's request-time check of a limit whose cost is only
			// charged when the stream is done. It passes on one whole
			// token, which the refill brings within 1/rate: an empty
			// bucket is over the limit for that long, and a bucket in
			// debt (the decision already rejected) for that long after
			// the debt is paid, so a client that waits retry-after is
			// not turned away once more.
			oneToken := ceilMS(time.Duration(float64(time.Second) / d.Bucket.Rate))
			switch {
			case d.Allowed && d.Remaining <= 0:
				d.Allowed, d.WouldAllow = false, false
				d.RetryAfter = oneToken
			case !d.Allowed:
				d.RetryAfter += oneToken
			}
		}
		warn = warn || (d.Warning && !d.DryRun)
		st.CurrentLimit = currentLimit(mapper, p.mapped, d, a.limit(i))
		st.LimitRemaining = uint32(min(max(0, d.Remaining), math.MaxUint32))
		st.DurationUntilReset = a.duration(i, ceilMS(d.ResetAt.Sub(now)))
		switch {
		case !d.Allowed:
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
			rejected = true
			bind, bindSet = d, true
			reason = d.Reason
			s.observe(domain, ResultOverLimit)
			continue
		case !d.WouldAllow:
			st.Code = rlsv3.RateLimitResponse_OK
			s.observe(domain, ResultWouldReject)
		default:
			st.Code = rlsv3.RateLimitResponse_OK
			s.observe(domain, ResultOK)
		}
		// Allowed so far: the headers report the limit closest to
		// exhaustion. A dry-run limit is invisible to clients.
		if !d.DryRun && (!bindSet || d.Remaining < bind.Remaining ||
			(d.Remaining == bind.Remaining && d.Limit < bind.Limit)) {
			bind, bindSet = d, true
		}
	}
	if bindSet {
		// As the HTTP middleware does: the caller hears about its soft
		// limit on the request itself.
		resp.ResponseHeadersToAdd = a.headers(&bind, now, warn, s.headers)
	}
	switch {
	case resp.OverallCode == rlsv3.RateLimitResponse_OK && len(taken) > 0:
		resp.DynamicMetadata = metadata(LeaseMetadataKey, strings.Join(taken, ","))
	case rejected && reason != "":
		resp.DynamicMetadata = metadata(ReasonMetadataKey, reason)
	}
	answered = true
	return resp, nil
}

// charge applies a charge descriptor: always OK, its status reporting the
// bucket after the charge (remaining 0 in debt).
func (s *Service) charge(ctx context.Context, domain string, p *plan, st *rlsv3.RateLimitResponse_DescriptorStatus, a *answer, i int, mapper *policy.Policy) error {
	c, ok := s.lim.(Charger)
	if !ok {
		return status.Errorf(codes.Unimplemented, "descriptors[%d]: this service cannot charge", i)
	}
	set, err := c.Charge(ctx, enforcement.Request{Key: p.mapped.Key, Scope: p.mapped.Scope, Tier: p.mapped.Tier, Cost: p.cost, HasCost: true, Domain: domain})
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return status.FromContextError(ctx.Err()).Err()
	case errors.Is(err, enforcement.ErrUnknownTier), errors.Is(err, enforcement.ErrInvalidRequest):
		return status.Errorf(codes.InvalidArgument, "descriptors[%d]: %v", i, err)
	case errors.Is(err, enforcement.ErrReserveUnsupported):
		return status.Errorf(codes.Unimplemented, "descriptors[%d]: %v", i, err)
	default:
		return status.Errorf(codes.Unavailable, "descriptors[%d]: %v", i, err)
	}
	st.Code = rlsv3.RateLimitResponse_OK
	st.CurrentLimit = currentLimit(mapper, p.mapped, enforcement.Decision{Limit: set.Limit}, a.limit(i))
	st.LimitRemaining = uint32(min(max(0, set.Remaining), math.MaxUint32))
	if !set.Queued {
		st.DurationUntilReset = a.duration(i, ceilMS(set.ResetAt.Sub(set.Now)))
	}
	return nil
}

func (s *Service) observe(domain string, r Result) {
	if s.obs != nil {
		s.obs.Descriptor(domain, r)
	}
}

// planOf validates and maps one descriptor.
func planOf(mapper *policy.Policy, domain string, requestHits uint32, d *ratelimitv3.RateLimitDescriptor, buf []policy.Entry) (plan, error) {
	es := d.GetEntries()
	switch {
	case len(es) == 0:
		return plan{}, errors.New("a descriptor needs at least one entry")
	case len(es) > MaxEntries:
		return plan{}, fmt.Errorf("%d entries, at most %d", len(es), MaxEntries)
	case d.GetIsNegativeHits():
		return plan{}, errors.New("is_negative_hits (a refund) is not supported")
	}
	entries := buf
	var p plan
	for j, e := range es {
		switch e.GetKey() {
		case ChargeEntryKey:
			p.charge = true
			continue
		case ReleaseEntryKey:
			if len(e.GetValue()) > maxReleaseBytes {
				return plan{}, fmt.Errorf("entries[%d]: a release of %d bytes, at most %d", j, len(e.GetValue()), maxReleaseBytes)
			}
			p.release, p.leases = true, e.GetValue()
			continue
		case PriorityEntryKey:
			if len(e.GetValue()) > MaxEntryBytes {
				return plan{}, fmt.Errorf("entries[%d]: a key or value is longer than %d bytes", j, MaxEntryBytes)
			}
			p.priority = e.GetValue()
			continue
		}
		if e.GetKey() == "" {
			return plan{}, fmt.Errorf("entries[%d]: the key is empty", j)
		}
		if len(e.GetKey()) > MaxEntryBytes || len(e.GetValue()) > MaxEntryBytes {
			return plan{}, fmt.Errorf("entries[%d]: a key or value is longer than %d bytes", j, MaxEntryBytes)
		}
		entries = append(entries, policy.Entry{Key: e.GetKey(), Value: e.GetValue()})
	}
	if p.release {
		// The leases name their keys and scopes: nothing to map.
		return plan{release: true, leases: p.leases}, nil
	}
	if p.charge && len(entries) == 0 {
		return plan{}, errors.New("a charge descriptor needs entries besides " + ChargeEntryKey)
	}
	// hits_addend is the cost: the descriptor's own if set, else the
	// request's if not zero (proto3 cannot tell 0 from unset, and Envoy
	// sends 0 unless configured), else the policy's cost for the scope.
	switch {
	case d.GetHitsAddend() != nil:
		p.cost, p.hasCost = int64(min(d.GetHitsAddend().GetValue(), MaxCost+1)), true
	case requestHits > 0:
		p.cost, p.hasCost = int64(requestHits), true
	}
	if p.cost > MaxCost {
		return plan{}, fmt.Errorf("hits_addend is more than %d", MaxCost)
	}
	if p.charge && !p.hasCost {
		return plan{}, errors.New("a charge descriptor needs a hits_addend: the cost to charge")
	}
	if mapper == nil {
		p.result = policy.MapUnknownDomain
		return p, nil
	}
	// On the concrete type the entries (the caller's stack buffer) do not
	// escape; through an interface they would, an allocation per call.
	p.mapped, p.result = mapper.MapDescriptor(domain, entries)
	if p.result != policy.MapOK {
		return p, nil
	}
	switch {
	case p.mapped.Key == "":
		return plan{}, fmt.Errorf("mapping %s makes an empty key", p.mapped.Name)
	case p.mapped.Scope == "":
		return plan{}, fmt.Errorf("mapping %s makes an empty scope", p.mapped.Name)
	case len(p.mapped.Key) > MaxKeyBytes:
		return plan{}, fmt.Errorf("mapping %s makes a key of %d bytes, at most %d", p.mapped.Name, len(p.mapped.Key), MaxKeyBytes)
	case len(p.mapped.Scope) > MaxScopeBytes:
		return plan{}, fmt.Errorf("mapping %s makes a scope of %d bytes, at most %d", p.mapped.Name, len(p.mapped.Scope), MaxScopeBytes)
	}
	// /check's rule for the text of a key and scope (httpapi.TextProblem).
	if prob := httpapi.TextProblem(p.mapped.Key); prob != "" {
		return plan{}, fmt.Errorf("mapping %s makes a key that %s", p.mapped.Name, prob)
	}
	if prob := httpapi.TextProblem(p.mapped.Scope); prob != "" {
		return plan{}, fmt.Errorf("mapping %s makes a scope that %s", p.mapped.Name, prob)
	}
	return p, nil
}

// currentLimit describes the limit that decided: the calendar quota when
// it binds (the decision reports the quota's limit), else the bucket's
// sustained rate in the smallest unit in which it is a whole number, or
// for a concurrency alone its slots (unit UNKNOWN). out is where to write
// it (the answer's own storage).
func currentLimit(mapper *policy.Policy, m policy.Mapped, d enforcement.Decision, out *rlsv3.RateLimitResponse_RateLimit) *rlsv3.RateLimitResponse_RateLimit {
	res, err := mapper.Resolve(m.Key, m.Scope, m.Tier)
	if err != nil {
		return nil
	}
	out.Name = res.Policy
	if !res.HasRate() {
		// A concurrency alone: its slots, in no unit of time.
		out.RequestsPerUnit = uint32(min(res.Concurrency, math.MaxUint32))
		out.Unit = rlsv3.RateLimitResponse_RateLimit_UNKNOWN
		return out
	}
	if res.HasQuota() && d.Limit == res.QuotaLimit && d.Limit != res.Burst && d.Source != enforcement.SourceDegraded {
		out.RequestsPerUnit = uint32(min(res.QuotaLimit, math.MaxUint32))
		switch res.QuotaPeriod {
		case limits.PeriodHour:
			out.Unit = rlsv3.RateLimitResponse_RateLimit_HOUR
		case limits.PeriodDay:
			out.Unit = rlsv3.RateLimitResponse_RateLimit_DAY
		case limits.PeriodMonth:
			out.Unit = rlsv3.RateLimitResponse_RateLimit_MONTH
		}
		return out
	}
	// The key's whole rate, split keys included (sub-buckets are an
	// implementation detail).
	out.RequestsPerUnit, out.Unit = rateUnit(res.Rate)
	return out
}

// rateUnit expresses tokens per second in the smallest of second, minute,
// hour and day in which it is a whole number (rounded in days otherwise).
func rateUnit(rate float64) (uint32, rlsv3.RateLimitResponse_RateLimit_Unit) {
	for _, u := range []struct {
		secs float64
		unit rlsv3.RateLimitResponse_RateLimit_Unit
	}{
		{1, rlsv3.RateLimitResponse_RateLimit_SECOND},
		{60, rlsv3.RateLimitResponse_RateLimit_MINUTE},
		{3600, rlsv3.RateLimitResponse_RateLimit_HOUR},
	} {
		n := rate * u.secs
		if r := math.Round(n); r >= 1 && math.Abs(n-r) < 1e-6*r {
			return uint32(min(r, math.MaxUint32)), u.unit
		}
	}
	return uint32(min(max(1, math.Round(rate*86400)), math.MaxUint32)), rlsv3.RateLimitResponse_RateLimit_DAY
}

// answer is a response and everything it points to, allocated at once:
// a call with one descriptor (Envoy's usual) costs one allocation for its
// whole response instead of one per message, string and slice (the
// allocations, and the GC work behind them, were a third of the service's
// own CPU). The response is handed to grpc-go, which marshals it and drops
// it, so nothing is pooled: a reuse would race with the marshaling.
type answer struct {
	resp     rlsv3.RateLimitResponse
	statusP  [1]*rlsv3.RateLimitResponse_DescriptorStatus
	status   [1]rlsv3.RateLimitResponse_DescriptorStatus
	limits   [1]rlsv3.RateLimitResponse_RateLimit
	reset    [1]durationpb.Duration
	headerP  [maxHeaders]*corev3.HeaderValue
	header   [maxHeaders]corev3.HeaderValue
	moreLim  []rlsv3.RateLimitResponse_RateLimit // descriptors past the first
	moreDurs []durationpb.Duration
}

// maxHeaders is what headers adds at most in the answer's own arrays: six
// legacy RateLimit headers, retry-after and the soft-limit warning. Mode
// Both adds the draft's two and takes its arrays from the heap instead, so
// that the default answer stays the size it was.
const maxHeaders = 8

func newAnswer(n int) *answer {
	a := &answer{}
	if n <= 1 {
		a.statusP[0] = &a.status[0]
		a.resp.Statuses = a.statusP[:n]
		return a
	}
	sts := make([]rlsv3.RateLimitResponse_DescriptorStatus, n)
	a.resp.Statuses = make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)
	for i := range sts {
		a.resp.Statuses[i] = &sts[i]
	}
	a.moreLim = make([]rlsv3.RateLimitResponse_RateLimit, n-1)
	a.moreDurs = make([]durationpb.Duration, n-1)
	return a
}

// limit is the storage of descriptor i's current_limit.
func (a *answer) limit(i int) *rlsv3.RateLimitResponse_RateLimit {
	if i == 0 {
		return &a.limits[0]
	}
	return &a.moreLim[i-1]
}

// duration is descriptor i's duration_until_reset set to d (as
// durationpb.New(d) would).
func (a *answer) duration(i int, d time.Duration) *durationpb.Duration {
	out := &a.reset[0]
	if i > 0 {
		out = &a.moreDurs[i-1]
	}
	out.Seconds = int64(d / time.Second)
	out.Nanos = int32(d % time.Second)
	return out
}

// headers are the RateLimit-* and X-RateLimit-* headers (as the HTTP
// middleware sets them: the limit, whole tokens left, whole seconds until
// the bucket is full), on a rejection Retry-After (whole seconds, rounded
// up), and with warn the soft-limit warning, for Envoy to add to the
// client's response; with mode Draft or Both the draft's RateLimit-Policy
// and RateLimit (package ratelimitheader). The values share one string.
func (a *answer) headers(d *enforcement.Decision, now time.Time, warn bool, mode ratelimitheader.Mode) []*corev3.HeaderValue {
	var buf [256]byte
	b := strconv.AppendInt(buf[:0], d.Limit, 10)
	nLimit := len(b)
	b = strconv.AppendInt(b, max(0, d.Remaining), 10)
	nRemaining := len(b)
	b = strconv.AppendInt(b, ratelimitheader.ResetSeconds(d, now), 10)
	nReset := len(b)
	retry := !d.Allowed && d.RetryAfter > 0
	if retry {
		b = strconv.AppendInt(b, ratelimitheader.RetryAfterSeconds(d), 10)
	}
	nRetry := len(b)
	draft := mode.DraftFields() && ratelimitheader.HasPolicy(d)
	nPolicy := nRetry
	if draft {
		b = ratelimitheader.AppendPolicy(b, d, now)
		nPolicy = len(b)
		b = ratelimitheader.AppendRateLimit(b, d, now)
	}
	vals := string(b)
	limit, remaining, reset := vals[:nLimit], vals[nLimit:nRemaining], vals[nRemaining:nReset]
	hv, ptrs := a.header[:0], a.headerP[:]
	if mode == ratelimitheader.Both {
		hv, ptrs = make([]corev3.HeaderValue, 0, maxHeaders+2), make([]*corev3.HeaderValue, maxHeaders+2)
	}
	if mode.LegacyFields() {
		hv = append(hv,
			corev3.HeaderValue{Key: "x-ratelimit-limit", Value: limit},
			corev3.HeaderValue{Key: "x-ratelimit-remaining", Value: remaining},
			corev3.HeaderValue{Key: "x-ratelimit-reset", Value: reset},
			corev3.HeaderValue{Key: "ratelimit-limit", Value: limit},
			corev3.HeaderValue{Key: "ratelimit-remaining", Value: remaining},
			corev3.HeaderValue{Key: "ratelimit-reset", Value: reset},
		)
	}
	if draft {
		hv = append(hv,
			corev3.HeaderValue{Key: "ratelimit-policy", Value: vals[nRetry:nPolicy]},
			corev3.HeaderValue{Key: "ratelimit", Value: vals[nPolicy:]},
		)
	}
	if retry {
		hv = append(hv, corev3.HeaderValue{Key: "retry-after", Value: vals[nReset:nRetry]})
	}
	if warn {
		hv = append(hv, corev3.HeaderValue{Key: warningHeader, Value: httpapi.SoftLimitWarning})
	}
	out := ptrs[:len(hv)]
	for i := range hv {
		out[i] = &hv[i]
	}
	return out
}

// warningHeader is httpapi.WarningHeader as HTTP/2 spells header names.
var warningHeader = strings.ToLower(httpapi.WarningHeader)

func ceilMS(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return (d + time.Millisecond - 1).Truncate(time.Millisecond)
}
