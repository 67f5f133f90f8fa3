-- billing_statements: the frozen statements (docs/billing.md). When a
-- period's grace for late events is over, the first statement asked of it
-- writes its lines here once, under a snapshot id; every later answer is
-- those lines, so a final statement is the same number every time it is
-- asked. What the record gains for that period afterwards is shown in a
-- later statement as an adjustment, never added here.
--
-- line is 'meter' (scope, unit: the period's usage of a scope),
-- 'correction' (ref = the correction id, scope) or 'adjustment' (ref = the
-- final period it belongs to). requests and cost are signed: corrections
-- and adjustments can subtract.
--
-- If two replicas freeze the same period at once, both snapshots are kept
-- and the first written (lowest finalized_ms, then snapshot) is the
-- statement: readers pick it, so no row is ever updated.
--
-- ORDER BY (key, tz, period, finalized_ms, snapshot): a statement reads
-- one key's snapshots in one zone. No partitions: a few rows per key and
-- month, kept for good (they are the invoices' record).
CREATE TABLE IF NOT EXISTS ${DB}.billing_statements (
    key          String,
    tz           String,
    period       String,
    snapshot     String,
    finalized_at DateTime('UTC'),
    finalized_ms UInt64,
    line         String,
    scope        String,
    unit         String,
    ref          String,
    requests     Int64,
    cost         Int64
) ENGINE = MergeTree()
ORDER BY (key, tz, period, finalized_ms, snapshot)
