-- usage_minute, usage_hour, usage_day: per-bucket counters, written by the
-- meter-consumer (not by materialized views, see schema/README.md).
--
-- Read them ALWAYS with sum() ... GROUP BY: rows collapse only on merge.
-- Rows whose key is '' are progress markers of the consumer (one per insert,
-- carrying the Kafka partition and the last offset the insert covers); their
-- counters are 0, so sums are unaffected, but lists of keys must skip key = ''.
--
-- ORDER BY (key, scope, tier, start, ...): the usage API reads one key over a
-- time range, optionally per scope. Data rows have kafka_partition = 0 and
-- kafka_offset = 0, so they collapse per (key, scope, tier, start); markers
-- differ in (kafka_partition, kafka_offset) and never collapse, and their
-- batches = 1 keeps SummingMergeTree from dropping them as all-zero rows.
-- Only the listed counters are summed; the bookkeeping columns are keys.
CREATE TABLE IF NOT EXISTS ${DB}.usage_minute (
    key             String,
    scope           String,
    tier            String,
    start           DateTime('UTC'),
    requests        UInt64,
    allowed         UInt64,
    rejected        UInt64,
    cost            UInt64,
    warnings        UInt64,
    batches         UInt64,
    kafka_partition UInt32,
    kafka_offset    UInt64
) ENGINE = SummingMergeTree((requests, allowed, rejected, cost, warnings, batches))
PARTITION BY toYYYYMM(start)
ORDER BY (key, scope, tier, start, kafka_partition, kafka_offset)
;
CREATE TABLE IF NOT EXISTS ${DB}.usage_hour (
    key             String,
    scope           String,
    tier            String,
    start           DateTime('UTC'),
    requests        UInt64,
    allowed         UInt64,
    rejected        UInt64,
    cost            UInt64,
    warnings        UInt64,
    batches         UInt64,
    kafka_partition UInt32,
    kafka_offset    UInt64
) ENGINE = SummingMergeTree((requests, allowed, rejected, cost, warnings, batches))
PARTITION BY toYYYYMM(start)
ORDER BY (key, scope, tier, start, kafka_partition, kafka_offset)
;
CREATE TABLE IF NOT EXISTS ${DB}.usage_day (
    key             String,
    scope           String,
    tier            String,
    start           DateTime('UTC'),
    requests        UInt64,
    allowed         UInt64,
    rejected        UInt64,
    cost            UInt64,
    warnings        UInt64,
    batches         UInt64,
    kafka_partition UInt32,
    kafka_offset    UInt64
) ENGINE = SummingMergeTree((requests, allowed, rejected, cost, warnings, batches))
PARTITION BY toYYYYMM(start)
ORDER BY (key, scope, tier, start, kafka_partition, kafka_offset)
