-- rollout_shadow: per rollout of the policy log and minute, the decisions
-- its candidate evaluated in shadow (decisions), those the policy in force
-- allowed and the candidate would have denied (newly_rejected: what
-- promoting it would newly reject), those the candidate would have denied
-- (would_reject) and those the policy in force denied (rejected). The
-- rollout judge reads sum(newly_rejected) / sum(decisions) of one rollout.
-- Written by the meter-consumer like the other rollups: read with sum()
-- ... GROUP BY; rows with rollout = 0 are the consumer's progress markers,
-- one per INSERT, kept apart by (kafka_partition, kafka_offset).
-- ORDER BY (rollout, start, ...): the judge reads one rollout's rows, a
-- chart reads them over time.
CREATE TABLE IF NOT EXISTS ${DB}.rollout_shadow (
    rollout         Int64,
    start           DateTime('UTC'),
    decisions       UInt64,
    newly_rejected  UInt64,
    would_reject    UInt64,
    rejected        UInt64,
    batches         UInt64,
    kafka_partition UInt32,
    kafka_offset    UInt64
) ENGINE = SummingMergeTree((decisions, newly_rejected, would_reject, rejected, batches))
PARTITION BY toYYYYMM(start)
ORDER BY (rollout, start, kafka_partition, kafka_offset)
;
-- decisions_raw gains the rollout whose candidate gave the shadow verdict
-- (NULL for a shadow rule, a candidate file, or no shadow).
ALTER TABLE ${DB}.decisions_raw ADD COLUMN shadow_revision Nullable(Int64)
