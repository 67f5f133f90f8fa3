package limits

// The bounds of a decision request (docs/reference.md, "POST /check"; api/openapi/limiter.yaml), the one
// place they are written: /check, the gRPC and Envoy rate limit service,
// the policy's descriptor mappings and the usage API's key and scope
// parameters all enforce these.
const (
	// MaxRequestBytes bounds a /check body and a gRPC request message.
	MaxRequestBytes = 64 << 10
	// MaxKeyBytes bounds a rate-limit key (1 to 256 bytes).
	MaxKeyBytes = 256
	// MaxScopeBytes bounds a scope (1 to 128 bytes).
	MaxScopeBytes = 128
	// MaxTierBytes bounds a tier's name.
	MaxTierBytes = 64
	// MaxCost is the largest cost one request may ask for.
	MaxCost = 1_000_000_000
)

// MaxConcurrency bounds a concurrency limit (policy `concurrency:`): the
// slots of one key and scope are one Redis sorted set, and each slot held
// is one member of it.
const MaxConcurrency = 1_000_000
