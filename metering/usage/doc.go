// Package usage is the usage API and customer dashboard (cmd/usage-api): it
// answers from the ClickHouse rollups (usage_minute, usage_hour, usage_day,
// always read with sum() ... GROUP BY; slots_minute, the concurrency slots,
// with sum() of its counts and max() of its peak) and never from the raw
// decisions.
//
// Authentication: the operator's bearer token (USAGE_ADMIN_TOKEN, compared
// in constant time) or a portal token issued by the operator. A portal token
// is "rwpt1.<claims>.<HMAC-SHA256>" (see token.go): it names one key and an
// expiry, and can read that key's data and nothing else; its revocation is a
// row in portal_token_events, so it survives restarts and reaches every
// replica within 2 s.
//
// Time zones: tz= sets where hour and day buckets start. The hour and day
// rollups are UTC-aligned, so planUsage reads the rollup whose buckets line
// up with the zone's: a day in UTC from usage_day; a day in a zone whose
// offsets are whole hours (Europe/Paris, America/New_York) from usage_hour
// re-bucketed with toStartOfDay(start, tz); an hour or a day in a zone with
// a half-hour or 45-minute offset (Asia/Kolkata, Asia/Kathmandu) from
// usage_minute re-bucketed with toStartOfHour/toStartOfDay(start, tz). The
// zone's offsets are checked over the requested range, so DST is handled.
//
// Every query is a small struct with a toSQL method; request values are
// bound arguments, only constants and the validated database name are SQL
// text. See README.md in this directory for the HTTP reference.
package usage
