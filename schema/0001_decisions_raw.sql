-- decisions_raw: every distinct decision event, once, in Kafka order.
--
-- Partitioned by calendar month (UTC) so that retention is `ALTER TABLE ...
-- DROP PARTITION 'YYYYMM'` and so that one consumer batch (which never spans
-- two months) is one atomic part.
--
-- ORDER BY (kafka_partition, kafka_offset): the consumer's resume point
-- (max offset per Kafka partition) and its deduplication window (the event ids
-- of the last offsets of a partition) are range reads on this key. Per-key
-- questions are answered by the rollups, not by this table.
CREATE TABLE IF NOT EXISTS ${DB}.decisions_raw (
    event_id        String,
    ts              UInt64,
    event_time      DateTime('UTC'),
    key             String,
    scope           String,
    tier            String,
    cost            UInt64,
    allowed         UInt8,
    source          String,
    remaining       Int64,
    limit_value     Int64,
    policy          String,
    dry_run         UInt8,
    warning         UInt8,
    instance        String,
    kafka_partition UInt32,
    kafka_offset    UInt64,
    inserted_at     DateTime('UTC') DEFAULT now()
) ENGINE = MergeTree()
PARTITION BY toYYYYMM(event_time)
ORDER BY (kafka_partition, kafka_offset)
