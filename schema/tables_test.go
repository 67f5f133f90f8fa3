package schema

import "testing"

func TestTableNamesAreCreated(t *testing.T) {
	ms, err := Migrations()
	if err != nil {
		t.Fatal(err)
	}
	created := map[string]bool{}
	for _, m := range ms {
		for _, st := range m.Statements {
			if g := createTable.FindStringSubmatch(st); g != nil {
				created[g[1]] = true
			}
		}
	}
	for _, name := range []string{DecisionsRaw, EventIDs, UsageMinute, UsageHour, UsageDay, ShadowHour, PortalTokenEvents, WebhookDeliveries, RolloutShadow, NotifierCheckpoints, UsageRegionMinute, UsageRegionHour, UsageRegionDay, BillingStatements, BillingCorrections, BillingExports, SlotsMinute, BillingExportPlans} {
		if !created[name] {
			t.Errorf("no migration creates table %s", name)
		}
		if _, ok := shardingKeys[name]; !ok {
			t.Errorf("table %s has no sharding key in cluster.go", name)
		}
	}
}
