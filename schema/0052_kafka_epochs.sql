-- kafka_epochs: the incarnations of each Kafka partition the meter-consumer
-- has read. A partition's log can start over (a topic deleted and created
-- again, a move to another Kafka cluster, a development broker that keeps
-- nothing): its offsets then begin again below the ones ClickHouse holds.
-- The consumer records a new epoch instead of skipping the new log, and keeps
-- writing kafka_offset as one increasing position per partition across
-- epochs:
--
--   position (kafka_offset in every metering table) = Kafka offset + base
--
-- Epoch 0 is implicit (base 0, no row): until a log starts over, kafka_offset
-- is the Kafka offset. An epoch's first position is one past the highest
-- position any table held when it began, so progress, markers and the
-- deduplication window need nothing else to stay exact across the boundary.
--
-- reason: 'restarted' (the log ends below what ClickHouse holds and no stored
-- event is found in it), 'replaced' (the message at the last stored offset is
-- another event: the log was recreated and grew past it), 'truncated' (the
-- same log lost its tail: the new epoch starts at its end).
--
-- ORDER BY (kafka_partition, epoch): the consumer reads one partition's
-- epochs, a handful of rows, on every resume.
CREATE TABLE IF NOT EXISTS ${DB}.kafka_epochs (
    kafka_partition UInt32,
    epoch           UInt32,
    base            Int64,
    first_position  UInt64,
    start_offset    UInt64,
    reason          String,
    log_start       UInt64,
    log_end         UInt64,
    prev_next       Int64,
    gap             UInt64,
    detected_at     DateTime('UTC'),
    detected_ms     UInt64
) ENGINE = MergeTree()
ORDER BY (kafka_partition, epoch)
