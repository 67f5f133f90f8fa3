package decisionevents

import (
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/metering"
)

// RecordReset emits the usage event of a support reset of key's quota
// (metering.KindReset), so that the key's usage history shows where its
// quota count went back to zero. id is the reset's (its audit record's).
// Nothing when metering is off.
func (p Parts) RecordReset(key, scope, id string, res enforcement.Resolved, at time.Time) {
	m := p.rec
	if m == nil {
		return
	}
	m.sink.Emit(metering.Event{
		EventID:        m.ids.Next(at),
		TS:             at.UnixMilli(),
		Key:            key,
		Scope:          scope,
		Tier:           res.Tier,
		Allowed:        true,
		Source:         "support",
		Remaining:      res.QuotaLimit,
		Limit:          res.QuotaLimit,
		Policy:         res.Policy,
		Instance:       m.instance,
		PolicyRevision: m.policyRevision(),
		Kind:           metering.KindReset,
		Reservation:    id,
		Region:         m.region,
	})
}
