package schema

// The tables the migrations create, named once for the Go code that reads
// and writes them (TestTableNamesAreCreated ties each to its migration).
const (
	// DecisionsRaw holds one row per decision event (0001).
	DecisionsRaw = "decisions_raw"
	// UsageMinute, UsageHour and UsageDay are the rollups of decisions_raw
	// by key, scope and tier (0002).
	UsageMinute = "usage_minute"
	UsageHour   = "usage_hour"
	UsageDay    = "usage_day"
	// UsageRegionMinute, UsageRegionHour and UsageRegionDay are the same
	// rollups per region as well, of the events that carry a region (0006).
	UsageRegionMinute = "usage_region_minute"
	UsageRegionHour   = "usage_region_hour"
	UsageRegionDay    = "usage_region_day"
	// EventIDs holds every distinct event's id and position once: the
	// consumer's long deduplication window (0005).
	EventIDs = "event_ids"
	// ShadowHour is the hourly rollup of shadow-limit verdicts (0004).
	ShadowHour = "shadow_hour"
	// PortalTokenEvents records portal tokens issued and revoked (0050).
	PortalTokenEvents = "portal_token_events"
	// WebhookDeliveries records every soft-limit webhook attempt (0051).
	WebhookDeliveries = "webhook_deliveries"
	// NotifierCheckpoints records which event the notifier decided at which
	// offset, to tell a log that started over from its own (0057).
	NotifierCheckpoints = "notifier_checkpoints"
	// KafkaEpochs records each new incarnation of a partition's log (0052).
	KafkaEpochs = "kafka_epochs"
	// PolicyAudit keeps every policy log record, applied or refused (0053).
	PolicyAudit = "policy_audit"
	// RolloutShadow is the per-minute rollup of a policy rollout's shadow
	// verdicts, which the rollout judge reads (0056).
	RolloutShadow = "rollout_shadow"
	// BillingStatements holds the frozen statements of final periods (0070).
	BillingStatements = "billing_statements"
	// BillingCorrections is the audit record of every correction (0071).
	BillingCorrections = "billing_corrections"
	// BillingExports records every row exported, with its identifier (0072).
	BillingExports = "billing_exports"
	// SlotsMinute is the per-minute rollup of slot decisions: slots
	// taken, refused, shed and released, and the peak in flight, per key,
	// scope, region and priority class (0080).
	SlotsMinute = "slots_minute"
	// BillingExportPlans holds the rows an export is about to send, their
	// values fixed before the send (0073).
	BillingExportPlans = "billing_export_plans"
)

// RollupTables are the usage rollups, finest first.
func RollupTables() []string { return []string{UsageMinute, UsageHour, UsageDay} }

// RegionRollupTables are the per-region usage rollups, finest first.
func RegionRollupTables() []string {
	return []string{UsageRegionMinute, UsageRegionHour, UsageRegionDay}
}

// RegionRollupOf is the per-region twin of a usage rollup table (usage_hour
// → usage_region_hour), or "" for any other table.
func RegionRollupOf(table string) string {
	switch table {
	case UsageMinute:
		return UsageRegionMinute
	case UsageHour:
		return UsageRegionHour
	case UsageDay:
		return UsageRegionDay
	}
	return ""
}
