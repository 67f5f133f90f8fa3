-- Regions: decisions_raw gains the region of the limiter that decided
-- (LIMITER_REGION; '' in a one-region deployment and for every event
-- written before the field existed), and the usage rollups get a
-- per-region twin.
--
-- 18.16 has no ADD COLUMN IF NOT EXISTS: Apply skips an ADD COLUMN whose
-- column system.columns already lists, which keeps this file idempotent.
ALTER TABLE ${DB}.decisions_raw ADD COLUMN region String DEFAULT ''
;
-- usage_region_minute, usage_region_hour, usage_region_day: the counters of
-- usage_minute/hour/day, per region as well. A sort key cannot be changed
-- (and SummingMergeTree would collapse the regions of one bucket into one
-- row if region were only a column), so the per-region rollups are tables
-- of their own, written by the meter-consumer in the same batches as the
-- others. Only events that carry a region have data rows: a one-region
-- deployment writes nothing but the markers here, and usage_* keep every
-- event, so a key's usage summed over regions is read from usage_* as
-- before; the usage recorded without a region is usage_* minus the sum of
-- these (docs/regions-usage.md).
--
-- Same rules as usage_*: read with sum() ... GROUP BY; rows with key = ''
-- are the consumer's progress markers (region '' too), one per INSERT, kept
-- apart by (kafka_partition, kafka_offset). ORDER BY (key, scope, tier,
-- region, start, ...): the usage API reads one key over a time range (one
-- scope, or all) grouped by region; the quota reader one region of every
-- key of a month.
CREATE TABLE IF NOT EXISTS ${DB}.usage_region_minute (
    key             String,
    scope           String,
    tier            String,
    region          String,
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
ORDER BY (key, scope, tier, region, start, kafka_partition, kafka_offset)
;
CREATE TABLE IF NOT EXISTS ${DB}.usage_region_hour (
    key             String,
    scope           String,
    tier            String,
    region          String,
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
ORDER BY (key, scope, tier, region, start, kafka_partition, kafka_offset)
;
CREATE TABLE IF NOT EXISTS ${DB}.usage_region_day (
    key             String,
    scope           String,
    tier            String,
    region          String,
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
ORDER BY (key, scope, tier, region, start, kafka_partition, kafka_offset)
