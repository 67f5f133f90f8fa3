package main

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/cmd/limiter/internal/sharedtier"
	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/limitmetrics"
	"github.com/ratewarden/ratewarden/enforcement/slots"
)

// minSlotTimeout is the floor of a slot call's deadline: a slot call is a
// round trip of its own, not a place in an auto-pipelined batch, so
// LIMITER_STORE_TIMEOUT's few milliseconds would degrade it on any hiccup.
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
