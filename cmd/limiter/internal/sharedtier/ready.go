package sharedtier

import (
	"context"
	"strings"
	"time"

	"github.com/ratewarden/ratewarden/limits"
)

// Readiness is the shared tier's part of /readyz: the limiter's status
// and why, and each store's entry.
type Readiness struct {
	Status  string `json:"status"` // ok | degraded
	Store   string `json:"store"`
	Breaker string `json:"breaker,omitempty"`
	Reason  string `json:"reason,omitempty"`
	// Cause is why Redis does not answer, in words (refused credentials, a
	// failed TLS handshake, a refused connection), while degraded; it names
	// the variables to check and never a secret.
	Cause string `json:"cause,omitempty"`
	// Stores is every shared store by name ("default" and REDIS_STORES's);
	// absent in single-node mode.
	Stores map[string]StoreReady `json:"stores,omitempty"`
}

// causeWait is how long /readyz waits for a fresh diagnosis.
const causeWait = 250 * time.Millisecond

// Ready is the tier's readiness. storeFailing is the limiter's view (its
// latest decision could not ask the store); missing are the stores the
// policy in force routes keys to that REDIS_STORES does not name
// (MissingStores). A named store that is degraded or missing makes the
// whole status degraded too (its keys are), the reason naming it. The
// caller answers 200 whatever it says: a limiter whose store is down
// still serves, degraded, and taking it out of rotation would turn a
// store outage into a platform outage.
func (t *Tier) Ready(ctx context.Context, storeFailing bool, missing []string) Readiness {
	b := Readiness{Status: "ok", Store: t.Kind}
	if t.states == nil {
		return b
	}
	var down []string
	b.Breaker, down = breakerOf(t.states())
	switch {
	case len(down) > 0:
		b.Status = "degraded"
		b.Reason = "shared store unavailable (" + strings.Join(down, ", ") + "): deciding with tightened local limits"
	case storeFailing:
		b.Status = "degraded"
		b.Reason = "the latest decision could not ask the shared store: decided with tightened local limits"
	case t.failing != nil && t.failing():
		b.Status = "degraded"
		b.Reason = "the fleet heartbeat cannot reach the shared store: decisions will be degraded"
	}
	if b.Status == "degraded" && t.diagnose != nil {
		// A probe waits this long for a fresh cause, then gets the latest
		// one (redisclient.Diagnose): with every Cluster node down a PING
		// takes its whole deadline, and a readiness probe that slow on a
		// busy machine would take every limiter out of rotation.
		ctx, cancel := context.WithTimeout(ctx, causeWait)
		defer cancel()
		b.Cause = t.diagnose(ctx)
	}
	t.addStores(&b, missing)
	return b
}

// addStores fills b.Stores.
func (t *Tier) addStores(b *Readiness, missing []string) {
	if len(t.stores) == 0 {
		return
	}
	b.Stores = make(map[string]StoreReady, len(t.stores)+len(missing))
	var down []string
	for _, h := range t.stores {
		r := readyOf(h, t.fleet.get(h.name))
		b.Stores[h.name] = r
		if h.name != limits.DefaultStore && r.Status != "ok" {
			down = append(down, h.name)
		}
	}
	for _, name := range missing {
		b.Stores[name] = StoreReady{Status: "missing", Breaker: "none",
			Reason: "the policy in force routes keys to it, but REDIS_STORES does not name it: its keys decide with tightened local limits"}
		down = append(down, name)
	}
	if len(down) > 0 && b.Status == "ok" {
		b.Status = "degraded"
		b.Reason = "store " + strings.Join(down, ", ") + " unavailable: the keys routed to it decide with tightened local limits"
	}
}
