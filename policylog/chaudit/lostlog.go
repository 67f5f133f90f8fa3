package chaudit

import (
	"context"
	"fmt"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/ratewarden/ratewarden/policylog"
)

// LostLog says whether st, a writer's read of the policy log, is of a log
// that was lost: it holds no record at all, yet policy_audit holds an
// earlier log's history. A write then would start a history that every
// limiter that kept the old one refuses (policylog/epoch.go), so writers
// refuse and point to `limiter policy restore --from-audit`; the reason
// says so. An audit that cannot be read proves nothing: it is not a lost
// log then (a new log is indistinguishable from a lost one without it,
// and the limiters still refuse a lost one).
func LostLog(ctx context.Context, conn driver.Conn, database string, st *policylog.State) (reason string, lost bool) {
	if st.NextOffset() != 0 {
		return "", false
	}
	rows, err := Query(ctx, conn, database, 0, 1)
	if err != nil || len(rows) == 0 {
		return "", false
	}
	return fmt.Sprintf("the policy log is empty, but policy_audit holds revision %d of an earlier log (%s by %s): the log was lost; "+
		"restore it first with `limiter policy restore --from-audit -m WHY` (docs/policy-log-recovery.md)", rows[0].Revision, rows[0].Subject, rows[0].Author), true
}
