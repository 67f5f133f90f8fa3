-- portal_token_events: issuance and revocation of usage-API portal tokens
-- (owned by the usage API). A token is revoked when a row with its id and
-- event = 'revoked' exists; rows are never updated, so a revocation survives
-- restarts and is visible to every replica.
--
-- ORDER BY (id, event): the only reads are "was this id issued / revoked",
-- point lookups on the key prefix.
CREATE TABLE IF NOT EXISTS ${DB}.portal_token_events (
    id          String,
    key         String,
    event       String,
    at          DateTime('UTC'),
    expires_at  DateTime('UTC')
) ENGINE = MergeTree()
PARTITION BY toYYYYMM(at)
ORDER BY (id, event)
