-- billing_corrections: the audit record of every correction (docs/billing.md):
-- who asked (operator, the identity of the admin credential), why
-- (reason), what (kind, scope, the range or event voided, the amounts of a
-- credit or debit, and request, the body as received) and the pieces it
-- became: the correction events published on the decisions log, which the
-- meter-consumer counts like any other event (the raw record is never
-- edited). pieces is their JSON, so that a correction asked again
-- publishes exactly the same events (same ids and times: the consumer's
-- deduplication counts them once).
--
-- If two requests with the same id race, both rows are kept and the first
-- written (lowest recorded_ms) is the correction: readers pick it.
--
-- ORDER BY (id, recorded_ms): a correction is looked up by id; the few of a
-- key are read whole. No partitions: kept for good.
CREATE TABLE IF NOT EXISTS ${DB}.billing_corrections (
    id          String,
    key         String,
    kind        String,
    scope       String,
    from_ms     UInt64,
    to_ms       UInt64,
    event_id    String,
    reason      String,
    operator    String,
    request     String,
    pieces      String,
    requests    Int64,
    cost        Int64,
    recorded_at DateTime('UTC'),
    recorded_ms UInt64
) ENGINE = MergeTree()
ORDER BY (id, recorded_ms)
