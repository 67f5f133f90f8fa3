package main

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/cmd/limiter/internal/sharedtier"
	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/limitmetrics"
	"github.com/ratewarden/ratewarden/enforcement/slots"
)

// minSlotTimeout is the floor of a slot call's deadline: a slot decided
// without the store loosens the fleet's bound on requests in flight (each
// limiter deciding degraded adds its own in-process slots), so it waits
// longer than a rate's decision, which LIMITER_STORE_TIMEOUT's few
// milliseconds would degrade on any hiccup.
const minSlotTimeout = 100 * time.Millisecond

// buildSlots is the concurrency layer in front of next (the limiter, with
// its spans): the stores' slot sets, LIMITER_LEASE_TTL, the tightened
// in-process set while a store cannot be asked, its metrics, and its
// decision events (events; nil when metering is off).
func buildSlots(cfg config, auth *sharedtier.Tier, lim *enforcement.Limiter, next slots.Checker, events slots.Recorder, reg prometheus.Registerer) (*slots.Gate, error) {
	def, named := auth.SlotStores()
	return slots.NewGate(slots.Config{
		Next:      next,
		Policy:    lim.Policy,
		Store:     def,
		Stores:    named,
		TTL:       cfg.LeaseTTL,
		Timeout:   max(cfg.StoreTimeout, minSlotTimeout),
		OpenFor:   cfg.BreakerOpenFor,
		Instances: lim.Instances,
		Observer:  limitmetrics.NewSlots(reg),
		Recorder:  events,
	})
}
