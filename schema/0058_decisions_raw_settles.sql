-- decisions_raw gains the settle and charge events (costs known only after
-- the work: docs/reserve-settle.md) as rows of their own, so that the raw
-- table, and the replay that reads it, see actual costs:
--   kind         'decision', 'settle' or 'charge'; every row written before
--                this migration is a decision. A settle or a charge is not
--                a request: count requests with kind = 'decision'.
--   reservation  the id of a reserving decision and of its settle ('' else);
--   estimate, actual, reserved_ts
--                as in the event: what the reservation spent, the actual
--                cost charged, the reservation's decision time in ms (0 when
--                the event has none);
--   actual_cost  the row's part of its key's actual cost: an allowed
--                decision's cost (a reservation's estimate), a settle's
--                actual − estimate, a charge's actual, 0 for a rejection.
--                sum(actual_cost) of any key's rows is what they cost, the
--                estimates of settled reservations corrected; signed, since
--                a settle below its estimate gives tokens back.
-- A settle's row is at its own time (event_time, ts): the rollups count its
-- difference in its reservation's minute instead, so the two agree over any
-- range that holds both.
--
-- 18.16 has no ADD COLUMN IF NOT EXISTS: Apply skips an ADD COLUMN whose
-- column system.columns already lists, which keeps this file idempotent.
ALTER TABLE ${DB}.decisions_raw ADD COLUMN kind String DEFAULT 'decision'
;
ALTER TABLE ${DB}.decisions_raw ADD COLUMN reservation String DEFAULT ''
;
ALTER TABLE ${DB}.decisions_raw ADD COLUMN estimate UInt64 DEFAULT 0
;
ALTER TABLE ${DB}.decisions_raw ADD COLUMN actual UInt64 DEFAULT 0
;
ALTER TABLE ${DB}.decisions_raw ADD COLUMN reserved_ts UInt64 DEFAULT 0
;
ALTER TABLE ${DB}.decisions_raw ADD COLUMN actual_cost Int64 DEFAULT if(allowed = 1, toInt64(cost), toInt64(0))
