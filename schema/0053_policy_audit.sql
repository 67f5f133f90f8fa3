-- policy_audit: every record of the policy log (topic ratelimit.policy),
-- applied or refused, kept for good (no partitions to drop: a few rows per
-- change). Written by meter-consumer's policy audit, which replays the log
-- by the apply rule so that result, code and reason are what every limiter
-- decided. content is the record exactly as written (JSON; for a garbled
-- record, its bytes).
--
-- ReplacingMergeTree ORDER BY kafka_offset: the offset is the record's
-- identity in the one partition, so a row written twice after a crash
-- collapses on merge (read with FINAL).
CREATE TABLE IF NOT EXISTS ${DB}.policy_audit (
    kafka_offset UInt64,
    log_key      String,
    revision     Int64,
    parent       Int64,
    kind         String,
    subject      String,
    author       String,
    message      String,
    time         DateTime('UTC'),
    hash         String,
    content      String,
    result       String,
    code         String,
    reason       String,
    recorded_at  DateTime('UTC')
) ENGINE = ReplacingMergeTree()
ORDER BY kafka_offset
