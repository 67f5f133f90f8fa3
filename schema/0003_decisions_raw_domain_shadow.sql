-- decisions_raw gains the event fields added within event version 1:
-- domain (the Envoy rate limit domain of a gRPC decision; '' for /check),
-- shadow (the shadow limit evaluated beside the decision; '' when none) and
-- shadow_rejected (1 when that limit would have rejected it).
--
-- 18.16 has no ADD COLUMN IF NOT EXISTS: Apply skips an ADD COLUMN whose
-- column system.columns already lists, which keeps this file idempotent.
ALTER TABLE ${DB}.decisions_raw ADD COLUMN domain String DEFAULT ''
;
ALTER TABLE ${DB}.decisions_raw ADD COLUMN shadow String DEFAULT ''
;
ALTER TABLE ${DB}.decisions_raw ADD COLUMN shadow_rejected UInt8 DEFAULT 0
