// Package support is the limiter's tools for the engineer answering a
// complaint about one key (docs/support.md): inspect, everything that
// decides the key's next answer read at one moment, each part named with
// where it lives and marked with its error when it could not be read; and
// reset, an audited change of the key's state in the store that every
// limiter hears of. The CLI (`limiter key inspect|reset`) and the
// limiter's admin API (/admin/keys/...) run the same code.
package support

import (
	"encoding/json"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/global"
	"github.com/ratewarden/ratewarden/enforcement/lease"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/policylog"
)

// Rule is the limit that applies to a (key, scope) and why: what `limiter
// policy explain` says, under the policy a limiter has in force.
type Rule struct {
	Policy  string            `json:"policy"`
	Tier    string            `json:"tier"`
	Cost    int64             `json:"cost"`
	DryRun  bool              `json:"dryRun"`
	Global  bool              `json:"global"`
	Limit   enforcement.Limit `json:"limit"`
	Explain string            `json:"explain,omitempty"`
	// From says whose policy this is: a limiter's URL, or POLICY_FILE.
	From string `json:"from,omitempty"`
	// Override is the policy log's override of the key in force, when
	// one is (its record, at Revision, has the author and the reason).
	Override *OverrideRef `json:"override,omitempty"`
}

// OverrideRef names an override in force: the key (and scope, empty for
// the whole key) and the policy log revision that set it.
type OverrideRef struct {
	Key      string `json:"key"`
	Scope    string `json:"scope,omitempty"`
	Revision int64  `json:"revision"`
	// Author, Reason and Message are the policy log's record of the
	// override: the author (its signing key's identity), the override's
	// reason and the record's message, as the limiter that applied it
	// keeps them beside its limit, or else read from the log
	// (Inspector.OverrideRecord); RecordError says why they are not shown.
	Author      string `json:"author,omitempty"`
	Reason      string `json:"reason,omitempty"`
	Message     string `json:"message,omitempty"`
	RecordError string `json:"recordError,omitempty"`
}

// RuleOf is the Rule of a resolved limit.
func RuleOf(res enforcement.Resolved, explain string) Rule {
	return Rule{Policy: res.Policy, Tier: res.Tier, Cost: res.Cost, DryRun: res.DryRun, Global: res.Global, Limit: res.Limit, Explain: explain}
}

// LocalAnswer is a limiter's answer to GET /admin/keys/local: its
// identity, the policy it applied, the rule it resolves for the key and
// its local tier's view of it.
type LocalAnswer struct {
	Instance string                `json:"instance"`
	Policy   policylog.Info        `json:"policy"`
	Rule     *Rule                 `json:"rule,omitempty"`
	RuleErr  string                `json:"ruleError,omitempty"`
	View     enforcement.LocalView `json:"view"`
	// Lease is what this limiter holds leased of the key's bucket (a hot
	// key's blocks); absent when leasing is off or it never leased it.
	Lease *lease.Held `json:"lease,omitempty"`
	// Global is this limiter's region's pool of a global key and the
	// global bucket at the home, as it read them; absent for a regional
	// key or a limiter without regions.
	Global *global.View `json:"global,omitempty"`
}

// Report is inspect's answer. A part that could not be read carries its
// error (and where it was read) and is never left out.
type Report struct {
	Key   string    `json:"key"`
	Scope string    `json:"scope"`
	At    time.Time `json:"at"`
	// Rule is what applies and why (from the first limiter that answered,
	// else POLICY_FILE).
	Rule RulePart `json:"rule"`
	// Bucket is the shared bucket, refilled to the store's clock.
	Bucket BucketPart `json:"bucket"`
	// Quota is the calendar quota's window (absent: the limit has none).
	Quota *QuotaPart `json:"quota,omitempty"`
	// Debt is the bucket's debt (tokens below zero; settles and charges
	// that took more than was there).
	Debt DebtPart `json:"debt"`
	// Reservations open on the key.
	Reservations ReservationsPart `json:"reservations"`
	// Split is each sub-bucket of a split key (absent: not split).
	Split *SplitPart `json:"split,omitempty"`
	// Leases held per limiter are in Limiters (lease: a hot key's blocks).
	// Global is the key's global budget (absent: the limit is regional).
	Global *GlobalPart `json:"global,omitempty"`
	// Limiters is one entry per limiter of the fleet: its local view.
	Limiters []LimiterPart `json:"limiters"`
	// Decisions are the latest recorded decisions of the key and scope.
	Decisions DecisionsPart `json:"decisions"`
	// Webhooks are the latest soft-limit webhooks sent for the key.
	Webhooks WebhooksPart `json:"webhooks"`
	// Resets are the audit records of the key's resets, newest first.
	Resets      []json.RawMessage `json:"resets"`
	ResetsError string            `json:"resetsError,omitempty"`
}

// Part is what every part carries: where it was read, and why it could
// not be (empty: it was).
type Part struct {
	Where string `json:"where"`
	Error string `json:"error,omitempty"`
}

// RulePart is the rule, or why it is unknown.
type RulePart struct {
	Part
	*Rule
}

// BucketPart is the shared bucket, or why it could not be read.
type BucketPart struct {
	Part
	*redisstore.BucketView
	StoreTime time.Time `json:"storeTime,omitzero"`
}

// QuotaPart is the quota window, or why it could not be read.
type QuotaPart struct {
	Part
	*redisstore.QuotaView
}

// DebtPart is the bucket's debt.
type DebtPart struct {
	Part
	Tokens float64 `json:"tokens"`
}

// SplitPart is a split key's sub-buckets.
type SplitPart struct {
	Part
	Buckets []redisstore.BucketView `json:"buckets"`
}

// NotePart is a part shown only as a note: what is known of it, or why
// it is not read.
type NotePart struct {
	Part
	Note string `json:"note,omitempty"`
}

// ReservationsPart is the key's open reservations (of every scope: a
// record names its key only), soonest to expire first, at most
// MaxReservationsListed of Total.
type ReservationsPart struct {
	Part
	Total int64                        `json:"total"`
	Open  []redisstore.ReservationView `json:"open,omitempty"`
	Note  string                       `json:"note,omitempty"`
}

// MaxReservationsListed bounds the reservations an inspect lists.
const MaxReservationsListed = 50

// GlobalPart is a global key's budget: the global bucket at the home and
// each region's pool, as the fleet's limiters read them (a limiter reads
// its own region's pool; the first that read the home's bucket gives it).
// A region of LIMITER_REGIONS none of whose limiters answered is listed
// with its error.
type GlobalPart struct {
	Part
	Bucket      *redisstore.BucketView `json:"bucket,omitempty"`
	BucketWhere string                 `json:"bucketWhere,omitempty"`
	BucketError string                 `json:"bucketError,omitempty"`
	Pools       []PoolPart             `json:"pools"`
}

// PoolPart is one region's pool, as one of its limiters (From) read it,
// or why it could not.
type PoolPart struct {
	global.PoolView
	From  string `json:"from"`
	Error string `json:"error,omitempty"`
}

// LimiterPart is one limiter's answer, or why it gave none.
type LimiterPart struct {
	URL string `json:"url"`
	Part
	*LocalAnswer
}

// DecisionsPart is the latest decisions recorded in ClickHouse.
type DecisionsPart struct {
	Part
	Rows []Decision `json:"rows"`
}

// WebhooksPart is the latest soft-limit webhook attempts in ClickHouse.
type WebhooksPart struct {
	Part
	Rows []Webhook `json:"rows"`
}

// Decision is one recorded decision (decisions_raw).
type Decision struct {
	Time           time.Time `json:"time"`
	Kind           string    `json:"kind"`
	Source         string    `json:"source"`
	Allowed        bool      `json:"allowed"`
	Cost           uint64    `json:"cost"`
	Remaining      int64     `json:"remaining"`
	Policy         string    `json:"policy"`
	PolicyRevision *int64    `json:"policyRevision,omitempty"`
	Region         string    `json:"region"`
	Instance       string    `json:"instance"`
	TraceID        *string   `json:"traceId,omitempty"`
}
