-- shadow_hour: per shadow limit, key and hour, how many decisions the shadow
-- limit saw and how many it would have rejected (beside how many the enforced
-- limit did reject), so a trial can be charted before it is enforced.
-- Written by the meter-consumer like the usage rollups: read with sum() ...
-- GROUP BY; rows with key = '' are the consumer's progress markers (shadow
-- '' too), one per INSERT, kept apart by (kafka_partition, kafka_offset).
-- Only decisions that carried a shadow verdict have data rows.
CREATE TABLE IF NOT EXISTS ${DB}.shadow_hour (
    shadow          String,
    key             String,
    start           DateTime('UTC'),
    decisions       UInt64,
    would_reject    UInt64,
    rejected        UInt64,
    batches         UInt64,
    kafka_partition UInt32,
    kafka_offset    UInt64
) ENGINE = SummingMergeTree((decisions, would_reject, rejected, batches))
PARTITION BY toYYYYMM(start)
ORDER BY (shadow, key, start, kafka_partition, kafka_offset)
