-- billing_exports: the record of what was exported where (docs/billing.md):
-- one row per exported row of a final statement, with its identifier (the
-- same row of the same statement has the same identifier in every export,
-- and Stripe's meter events deduplicate by it), the destination ('stripe',
-- 'csv:<file>', 'json:<file>') and when. An export that stops resumes by
-- sending only the identifiers this table does not hold for its
-- destination; a crash between a send and its record sends that chunk
-- again under the same identifiers, recorded once more: count with
-- uniqExact(identifier).
--
-- ORDER BY (destination, period, identifier): a resumed export reads one
-- destination's identifiers of one period. No partitions: kept for good.
CREATE TABLE IF NOT EXISTS ${DB}.billing_exports (
    destination String,
    period      String,
    tz          String,
    identifier  String,
    key         String,
    line        String,
    scope       String,
    ref         String,
    measure     String,
    requests    Int64,
    cost        Int64,
    exported_at DateTime('UTC'),
    exported_ms UInt64
) ENGINE = MergeTree()
ORDER BY (destination, period, identifier)
