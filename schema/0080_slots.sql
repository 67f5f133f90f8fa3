-- Slot decisions on concurrency limits (docs/concurrency.md).
--
-- decisions_raw gains the members of a slot event:
--   slot       'taken', 'refused', 'shed' or 'released' ('' for any other
--              event). A slot event of kind 'slot' is no request (its
--              request was counted by its rate's decision, or it is a
--              release); one of kind 'decision' is the request of a limit
--              that is a concurrency alone.
--   priority   the request's priority class ('' when none applies);
--   in_flight  the slots of the key and scope held just after the call.
--
-- 18.16 has no ADD COLUMN IF NOT EXISTS: Apply skips an ADD COLUMN whose
-- column system.columns already lists, which keeps this file idempotent.
ALTER TABLE ${DB}.decisions_raw ADD COLUMN slot String DEFAULT ''
;
ALTER TABLE ${DB}.decisions_raw ADD COLUMN priority String DEFAULT ''
;
ALTER TABLE ${DB}.decisions_raw ADD COLUMN in_flight UInt64 DEFAULT 0
;
-- slots_minute: per key, scope, region, priority class and minute, the
-- slots taken, refused (every slot held), shed (the class's share held)
-- and released, and the most slots held after any slot decision of the
-- minute (peak_in_flight). Written by the meter-consumer in the same
-- batches as the usage rollups; rows with key = '' are its progress
-- markers, one per INSERT, kept apart by (kafka_partition, kafka_offset).
-- A plain MergeTree, never summed on merge: a maximum is not a sum. Read
-- with sum() of the counts and max() of peak_in_flight ... GROUP BY.
-- ORDER BY (key, start, ...): the usage API reads one key over a time
-- range.
CREATE TABLE IF NOT EXISTS ${DB}.slots_minute (
    key             String,
    scope           String,
    region          String,
    priority        String,
    start           DateTime('UTC'),
    taken           UInt64,
    refused         UInt64,
    shed            UInt64,
    released        UInt64,
    peak_in_flight  UInt64,
    batches         UInt64,
    kafka_partition UInt32,
    kafka_offset    UInt64
) ENGINE = MergeTree()
PARTITION BY toYYYYMM(start)
ORDER BY (key, start, scope, region, priority, kafka_partition, kafka_offset)
