-- billing_export_plans: the rows an export is about to send, written
-- before they are sent
-- (docs/billing.md, "Hourly export of the open period").
-- A row of the open month (line 'hourly') is a key's usage since
-- the rows planned before it, so its value depends on when it is made;
-- writing it here first fixes its value under its identifier, and an
-- export that stops between the plan and the send sends exactly that row
-- (same identifier, same value) when run again. A final month's rows
-- (line 'total') are planned the same way. billing_exports then records
-- what was sent.
--
-- If two exports plan the same identifier at once, both rows are kept and
-- the first planned (lowest planned_ms) is the row: readers pick it.
--
-- ORDER BY (destination, period, identifier, planned_ms): an export reads
-- one destination's plans of one period. No partitions: kept for good.
CREATE TABLE IF NOT EXISTS ${DB}.billing_export_plans (
    destination String,
    period      String,
    tz          String,
    identifier  String,
    key         String,
    line        String,
    ref         String,
    measure     String,
    requests    Int64,
    cost        Int64,
    planned_at  DateTime('UTC'),
    planned_ms  UInt64
) ENGINE = MergeTree()
ORDER BY (destination, period, identifier, planned_ms)
