-- decisions_raw gains what makes every decision traceable to the policy
-- in force and replayable exactly:
--   policy_revision  the policy log's revision the limiter enforced (NULL in
--                    file mode, from the bootstrap file, or from an event
--                    written before the field existed);
--   decided_us       for a shared decision, the instant the store decided
--                    (Redis TIME, microseconds since the epoch; NULL for a
--                    local decision or an older event). Replay runs the
--                    bucket at this instant rather than at ts, the
--                    limiter's clock before the store call.
-- policy_audit gains the incarnation of the policy log a row belongs to. A
-- log can start over (a development broker that keeps nothing, a topic
-- recreated): its offsets begin again at 0. kafka_offset stays the row's
-- identity as a position increasing across incarnations,
--   kafka_offset = log_offset + (the first position of epoch log_epoch),
-- so the rows of an earlier log are kept and never replaced by the new
-- one's. Rows written before this migration are epoch 0, where the position
-- is the offset.
--
-- 18.16 has no ADD COLUMN IF NOT EXISTS: Apply skips an ADD COLUMN whose
-- column system.columns already lists, which keeps this file idempotent.
ALTER TABLE ${DB}.decisions_raw ADD COLUMN policy_revision Nullable(Int64)
;
ALTER TABLE ${DB}.decisions_raw ADD COLUMN decided_us Nullable(Int64)
;
ALTER TABLE ${DB}.policy_audit ADD COLUMN log_epoch UInt32 DEFAULT 0
;
ALTER TABLE ${DB}.policy_audit ADD COLUMN log_offset Int64 DEFAULT toInt64(kafka_offset)
