package sharedtier

import (
	"strings"

	"github.com/ratewarden/ratewarden/cmd/limiter/internal/spans"
	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/lease"
	"github.com/ratewarden/ratewarden/enforcement/split"
	"github.com/ratewarden/ratewarden/internal/tracing"
)

// Order is the limiter's decision path in one line, each stage named
// once, in the order a decision crosses them. Path assembles it;
// README.md's "Decision path" states this line and explains each stage in
// this order (path_test.go holds the two together).
const Order = "transport → tracing → local tier → (global | lease → split → store → guard → pipeline) → shadow trial → metrics → metering"

// Stages are Order's stage names, in order.
func Stages() []string {
	r := strings.NewReplacer("(", "", ")", "", " | ", " → ")
	return strings.Split(r.Replace(Order), " → ")
}

// Parts are the decision path's parts, each built by its own package
// before Path joins them.
type Parts struct {
	Tracer *tracing.Provider // tracing: off (no spans) unless an OTLP endpoint is set
	Tier   *Tier             // lease → split → store → guard → pipeline (Build)
	Region *Region           // global (BuildRegion); nil in a one-region deployment
	// Shadow is the shadow trial, itself a Limiter over the shadow chain
	// (ShadowChain); nil = none.
	Shadow   enforcement.ShadowEvaluator
	Metrics  enforcement.Observer // metrics: hot keys, then limitmetrics
	Metering enforcement.Recorder // metering: the decision as an event; nil = off
}

// Path is the one place that joins the decision path, in this order
// (Order):
//
//	transport     POST /check (enforcement/httpapi) and gRPC ShouldRateLimit
//	              (rlsserver) call the Checker Path returns
//	tracing       a span per decision (spans.Check), and one per call
//	              below the local tier (spans.Authority), when tracing is on
//	local tier    enforcement.Limiter: the limit the policy resolves, the
//	              local buckets that answer floods, the failure policy
//
//	then, for what the local tier passes on, either (enforcement.Limiter
//	picks by the limit's scope)
//
//	global        a limit of scope global in a deployment of regions: the
//	              region's pool of the home's budget (enforcement/global)
//
//	or the shared tier (Build; the same chain code builds all three):
//
//	lease         hot keys spend blocks leased from the store, in-process
//	              (LIMITER_LEASE_BLOCK > 0)
//	split         split keys spread over sub-buckets
//	store         the store the key's limit names (enforcement.Stores), one
//	              redisstore.Shared each; in-process without Redis
//	guard         per shard: the deadline and the circuit breaker
//	pipeline      per server: the auto-pipelined EVALSHA of the bucket script
//
//	and after the decision, its hooks in this order (enforcement.Limiter
//	calls them so, once the enforced decision is final):
//
//	shadow trial  shadow limits decided beside it, in a namespace of their
//	              own, over split → store → guard → pipeline (ShadowChain)
//	metrics       hot keys, then limitmetrics
//	metering      the decision as an event (decisionevents)
//
// base holds the local tier's settings (policy, sizes, degraded ceiling,
// reservations' TTL); Path sets every field that wires the path.
func Path(base enforcement.Config, p Parts) (*enforcement.Limiter, spans.Checker, error) {
	base.Authority = spans.Authority(p.Tracer, p.Tier, p.Tier.Kind)
	base.Global = p.Region.Authority()
	base.Regions = p.Region.Count()
	base.Reservations = p.Tier.Reservations // split, then the stores: no lease
	base.Peeker = p.Tier.Peeker             // POST /check "peek": split, then the stores, read only
	base.Shadow = p.Shadow
	base.Observer = p.Metrics
	base.Recorder = p.Metering
	lim, err := enforcement.New(base)
	if err != nil {
		return nil, nil, err
	}
	return lim, spans.Check(p.Tracer, lim), nil
}

// chainSpec is one chain below the local tier.
type chainSpec struct {
	bottom enforcement.Authority // the store: the routing over the stores, a shadow namespace, in-process buckets, or global's pools
	stages []string              // the bottom's stage names, from the top
	split  bool                  // split keys spread over sub-buckets of bottom
	// lease, when set, puts leases on top, their blocks taken from
	// leaseStore.
	lease      *lease.Config
	leaseStore lease.Store
}

// chain is the one code that stacks a chain below the local tier, for the
// enforced tier, the shadow tier and the regions' global limits: the
// bottom, split over it, lease over that.
func chain(c chainSpec) built {
	b := built{auth: c.bottom, stages: c.stages}
	if c.split {
		sp := split.New(b.auth, nil)
		b.auth, b.peek, b.stages = sp, sp, append([]string{"split"}, b.stages...)
	}
	if c.lease != nil {
		b.lease = lease.New(b.auth, c.leaseStore, *c.lease)
		b.auth, b.stages = b.lease, append([]string{"lease"}, b.stages...)
	}
	return b
}

// built is a chain: its top, its lease (nil without), what answers a peek
// (split over the stores, read only: a peek takes no lease block; nil
// without split) and its stage names from the top.
type built struct {
	auth   enforcement.Authority
	lease  *lease.Authority
	peek   enforcement.Peeker
	stages []string
}
