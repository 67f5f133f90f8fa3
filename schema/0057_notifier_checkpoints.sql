-- notifier_checkpoints: which event the soft-limit notifier (consumer group
-- "notifier") decided at which Kafka offset, per partition, about once a
-- second. Kafka's committed offsets say where the group stopped but not in
-- which log: after a topic is recreated, the stack moves to another Kafka
-- cluster or a development broker starts empty, the committed offset of the
-- old log would skip the new one's first messages (or wait for ever past its
-- end). On every assignment the notifier reads the latest checkpoint of the
-- partition and the event the broker holds at that offset: the same event id
-- is the same log; another event, or none (the log ends below it), is a log
-- that started over, read from its start (metering/notify/epoch.go). A row
-- with kafka_offset -1 records such a start (nothing to compare yet).
--
-- ORDER BY (kafka_partition, recorded_ms): the notifier reads the latest row
-- of one partition. Monthly partitions: retention is a partition drop (keep
-- the current month).
CREATE TABLE IF NOT EXISTS ${DB}.notifier_checkpoints (
    kafka_partition UInt32,
    kafka_offset    Int64,
    event_id        String,
    recorded_at     DateTime('UTC'),
    recorded_ms     UInt64
) ENGINE = MergeTree()
PARTITION BY toYYYYMM(recorded_at)
ORDER BY (kafka_partition, recorded_ms)
