-- webhook_deliveries: one row per attempt to deliver a soft-limit webhook
-- (written by the notifier in meter-consumer, read by the usage API's
-- operator endpoint). delivery_id is the webhook-id header, the same for
-- every attempt of one notification. outcome is 'delivered' (2xx),
-- 'retrying' (failed, another attempt is scheduled) or 'failed' (failed, no
-- more attempts). The URL is recorded without query or user info.
--
-- ORDER BY (key, delivery_id, attempt): the operator asks per key, and the
-- notifier warms its cool-downs from recent deliveries at start.
CREATE TABLE IF NOT EXISTS ${DB}.webhook_deliveries (
    delivery_id  String,
    attempt      UInt16,
    key          String,
    scope        String,
    tier         String,
    url          String,
    event_id     String,
    event_ts     UInt64,
    attempted_at DateTime('UTC'),
    attempted_ms UInt64,
    status_code  UInt16,
    error        String,
    duration_ms  UInt32,
    outcome      String
) ENGINE = MergeTree()
PARTITION BY toYYYYMM(attempted_at)
ORDER BY (key, delivery_id, attempt)
