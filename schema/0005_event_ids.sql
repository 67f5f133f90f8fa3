-- event_ids: the id of every distinct decision event once, with its Kafka
-- partition and position (kafka_offset, as in decisions_raw): the consumer's
-- long deduplication window. A message whose event id is not among the
-- recent ones the consumer holds in memory, and whose decision time is older
-- than every event it has forgotten, is looked up here by id before it is
-- counted (metering/consumer/dedup.go): a producer retry or a spool resent
-- hours or days after its original is still discarded.
--
-- Partitioned by calendar month (UTC), like decisions_raw, so that one
-- consumer batch is one atomic part and retention is a partition drop: the
-- window reaches as far back as the months kept (docs/exactness.md).
--
-- ORDER BY (kafka_partition, event_time, event_id): a lookup names the
-- partition, the second range of the late events' decision times and their
-- ids, so it reads only the granules of those seconds of that partition.
CREATE TABLE IF NOT EXISTS ${DB}.event_ids (
    kafka_partition UInt32,
    event_time      DateTime('UTC'),
    event_id        String,
    kafka_offset    UInt64
) ENGINE = MergeTree()
PARTITION BY toYYYYMM(event_time)
ORDER BY (kafka_partition, event_time, event_id)
