package httpapi

import (
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/ratelimitheader"
	"github.com/ratewarden/ratewarden/internal/jsonstr"
)

// KeyFunc returns the rate-limit key of a request, or "" when it has none.
type KeyFunc func(r *http.Request) string

// HeaderKey keys on an identity header such as X-API-Key, prefixed with
// prefix (e.g. "key:") so identities and addresses never share a bucket.
func HeaderKey(header, prefix string) KeyFunc {
	return func(r *http.Request) string {
		if v := r.Header.Get(header); v != "" {
			return prefix + v
		}
		return ""
	}
}

// FirstKey tries each KeyFunc in order: identity first, address as fallback.
func FirstKey(fns ...KeyFunc) KeyFunc {
	return func(r *http.Request) string {
		for _, fn := range fns {
			if k := fn(r); k != "" {
				return k
			}
		}
		return ""
	}
}

// AddressKey keys on the client address ("ip:203.0.113.7"), read from
// forwarded headers only when the direct peer is a trusted proxy.
func AddressKey(p *Proxies) KeyFunc {
	return func(r *http.Request) string {
		if a := p.ClientAddr(r); a.IsValid() {
			return enforcement.AddressKeyPrefix + a.String()
		}
		return ""
	}
}

// Guard applies a Checker to HTTP requests: it sets the RateLimit-* headers on
// every response and answers a rejection with 429. It is safe for concurrent
// use; Middleware and the gin adapter are thin wrappers around Allow.
type Guard struct {
	Checker Checker
	// Key extracts the rate-limit key. Required.
	Key KeyFunc
	// Scope names the endpoint class of a request (default: the route
	// pattern, e.g. "GET /v1/items/{id}", else the method and path).
	Scope func(r *http.Request) string
	// Cost of a request (default: the policy's cost for the scope).
	Cost func(r *http.Request) (cost int64, ok bool)
	// Log receives errors (default: discarded).
	Log *slog.Logger
	// Priority names a request's priority class, its share of a bucket
	// and of a concurrency limit (default: the PriorityHeader header, ""
	// when absent: the default class). The class is the caller's claim: strip the header at the
	// edge, or set Priority, where clients must not choose their own.
	Priority func(r *http.Request) string
	// Headers selects the rate-limit header fields (default Both: the
	// legacy RateLimit-Limit/-Remaining/-Reset trio and the IETF draft's
	// RateLimit-Policy and RateLimit). With Legacy, a 429 is answered as
	// before (application/json, the error object only); otherwise as the
	// draft's quota-exceeded problem (application/problem+json), which
	// carries the same error object.
	Headers ratelimitheader.Mode
}

// Allow decides r and writes the headers. It returns false after writing
// the 429 (or error) response, in which case the caller must stop. It
// holds no slot of a concurrency limit (a slot taken is given back at
// once): use Hold, as Middleware does, for those.
func (g *Guard) Allow(w http.ResponseWriter, r *http.Request) bool {
	d, ok := g.check(w, r, g.request(r))
	if ok && d.Lease != "" {
		_, done := g.hold(r, &d)
		done()
	}
	return ok
}

// request is the decision request of r.
func (g *Guard) request(r *http.Request) enforcement.Request {
	key := g.Key(r)
	if key == "" {
		key = enforcement.AnonymousKey
	}
	req := enforcement.Request{Key: key, Scope: g.scope(r)}
	if g.Cost != nil {
		req.Cost, req.HasCost = g.Cost(r)
	}
	if g.Priority != nil {
		req.Priority = g.Priority(r)
	} else {
		req.Priority = r.Header.Get(PriorityHeader)
	}
	return req
}

// check decides req for r and answers a rejection; ok reports whether the
// handler may run. Allow and the reserving middleware share it.
func (g *Guard) check(w http.ResponseWriter, r *http.Request, req enforcement.Request) (d enforcement.Decision, ok bool) {
	key := req.Key
	d, err := g.Checker.Check(r.Context(), req)
	if err != nil && r.Context().Err() != nil {
		return d, false // the client went away: nobody to answer, nothing to log
	}
	if err != nil {
		// A request that can never be decided is the service's
		// misconfiguration, not the client's fault: say so and stop.
		if g.Log != nil {
			g.Log.Error("rate limit check failed", "key", key, "scope", req.Scope, "err", err)
		}
		WriteError(w, &Error{Status: http.StatusInternalServerError, Code: "limiter_error", Message: "the rate limiter could not decide this request"}, requestID(r))
		return d, false
	}
	now := time.Now()
	setHeaders(w.Header(), &d, now, g.Headers)
	if d.Allowed {
		return d, true
	}
	secs := ratelimitheader.RetryAfterSeconds(&d)
	w.Header().Set(ratelimitheader.RetryAfter, strconv.FormatInt(secs, 10))
	e := rejection(&d, secs)
	if g.Headers == ratelimitheader.Legacy {
		WriteError(w, e, requestID(r))
	} else {
		writeQuotaExceeded(w, e, &d, requestID(r))
	}
	return d, false
}

// QuotaExceededType is the problem type of a 429 (RFC 9457), as
// draft-ietf-httpapi-ratelimit-headers-11 section 5.1 registers it.
const QuotaExceededType = "https://iana.org/assignments/http-problem-types#quota-exceeded"

// writeQuotaExceeded answers a rejection as an RFC 9457 problem of the
// draft's quota-exceeded type, with its "violated-policies" member (the
// policy items of the RateLimit field that could not pay), and the
// contract's error object beside it for the callers that read that.
func writeQuotaExceeded(w http.ResponseWriter, e *Error, d *enforcement.Decision, requestID string) {
	b := make([]byte, 0, 512)
	b = append(b, `{"type":"`+QuotaExceededType+`","title":"Quota Exceeded","status":`...)
	b = strconv.AppendInt(b, int64(e.Status), 10)
	b = append(b, `,"detail":`...)
	b = jsonstr.Append(b, e.Message)
	b = append(b, `,"violated-policies":`...)
	b = ratelimitheader.AppendViolated(b, d)
	b = append(b, ',')
	b = appendErrorMember(b, e, requestID)
	b = append(b, "}\n"...)
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(e.Status)
	_, _ = w.Write(b)
}

func plural(n int64) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func (g *Guard) scope(r *http.Request) string {
	if g.Scope != nil {
		return g.Scope(r)
	}
	if r.Pattern != "" {
		return r.Pattern
	}
	return r.Method + " " + r.URL.Path
}

// WarningHeader is set on a response whose decision reached the soft limit
// (Decision.Warning), with the value SoftLimitWarning: the caller learns
// it is close to its limit on the request itself, not only from the
// soft-limit webhook its operator receives.
const WarningHeader = "RateLimit-Warning"

// SoftLimitWarning is WarningHeader's value: consumption is at or above
// the rule's soft_limit_percent of the bucket or the quota.
const SoftLimitWarning = "soft-limit"

// The draft's field names as http.Header keys them.
const (
	canonicalPolicyField    = "Ratelimit-Policy"
	canonicalRateLimitField = "Ratelimit"
)

// setHeaders sets the fields mode selects, and WarningHeader.
func setHeaders(h http.Header, d *enforcement.Decision, now time.Time, mode ratelimitheader.Mode) {
	if mode.LegacyFields() {
		h.Set(ratelimitheader.LimitField, strconv.FormatInt(d.Limit, 10))
		h.Set(ratelimitheader.RemainingField, strconv.FormatInt(max(0, d.Remaining), 10))
		h.Set(ratelimitheader.ResetField, strconv.FormatInt(ratelimitheader.ResetSeconds(d, now), 10))
	}
	if mode.DraftFields() && ratelimitheader.HasPolicy(d) {
		// Both values share one string and one slice, set under their
		// canonical keys directly: two allocations instead of six.
		var buf [256]byte
		b := ratelimitheader.AppendPolicy(buf[:0], d, now)
		n := len(b)
		b = ratelimitheader.AppendRateLimit(b, d, now)
		both := string(b)
		vals := make([]string, 2)
		vals[0], vals[1] = both[:n], both[n:]
		h[canonicalPolicyField] = vals[0:1:1]
		h[canonicalRateLimitField] = vals[1:2:2]
	}
	if d.Warning {
		h.Set(WarningHeader, SoftLimitWarning)
	}
}

// Middleware wraps next with g: a request on a concurrency limit holds its
// slot while next runs and gives it back when next returns or panics
// (Hold).
func Middleware(g *Guard) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r, done, ok := g.Hold(w, r)
			if !ok {
				return
			}
			defer done()
			next.ServeHTTP(w, r)
		})
	}
}

func requestID(r *http.Request) string {
	if id := r.Header.Get("X-Request-Id"); id != "" && len(id) <= 128 {
		return id
	}
	var b [10]byte
	_, _ = rand.Read(b[:])
	return "req_" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
}

// Proxies is the list of networks whose forwarded headers are believed.
// The zero value trusts nobody: the client address is the direct peer.
type Proxies struct {
	trusted []netip.Prefix
}

// NewProxies parses CIDRs or addresses ("10.0.0.0/8", "127.0.0.1").
func NewProxies(cidrs ...string) (*Proxies, error) {
	p := &Proxies{}
	var errs []error
	for _, c := range cidrs {
		c = strings.TrimSpace(c)
		if c == "" {
			continue
		}
		if !strings.Contains(c, "/") {
			a, err := netip.ParseAddr(c)
			if err != nil {
				errs = append(errs, fmt.Errorf("trusted proxy %q: %w", c, err))
				continue
			}
			p.trusted = append(p.trusted, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
			continue
		}
		pr, err := netip.ParsePrefix(c)
		if err != nil {
			errs = append(errs, fmt.Errorf("trusted proxy %q: %w", c, err))
			continue
		}
		p.trusted = append(p.trusted, pr.Masked())
	}
	return p, errors.Join(errs...)
}

func (p *Proxies) trusts(a netip.Addr) bool {
	if p == nil {
		return false
	}
	a = a.Unmap()
	for _, pr := range p.trusted {
		if pr.Contains(a) {
			return true
		}
	}
	return false
}

// ClientAddr is the address the request came from. Forwarded headers are
// read only when the direct peer is trusted; then the chain is walked from
// the nearest hop outwards and the first address that is not a trusted
// proxy is the client (so a client cannot prepend a spoofed hop).
// Forwarded (RFC 7239) wins over X-Forwarded-For when both are present.
func (p *Proxies) ClientAddr(r *http.Request) netip.Addr {
	peer, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		a, err := netip.ParseAddr(r.RemoteAddr)
		if err != nil {
			return netip.Addr{}
		}
		peer = netip.AddrPortFrom(a, 0)
	}
	client := peer.Addr().Unmap()
	if !p.trusts(client) {
		return client
	}
	hops := forwardedFor(r.Header.Values("Forwarded"))
	if len(hops) == 0 {
		hops = xForwardedFor(r.Header.Values("X-Forwarded-For"))
	}
	for i := len(hops) - 1; i >= 0; i-- {
		a, ok := parseHop(hops[i])
		if !ok {
			return client // garbage in the chain: stop at the last address we could trust
		}
		client = a
		if !p.trusts(a) {
			return a
		}
	}
	return client
}

func xForwardedFor(values []string) []string {
	var hops []string
	for _, v := range values {
		for _, h := range strings.Split(v, ",") {
			if h = strings.TrimSpace(h); h != "" {
				hops = append(hops, h)
			}
		}
	}
	return hops
}

func forwardedFor(values []string) []string {
	var hops []string
	for _, v := range values {
		for _, elem := range strings.Split(v, ",") {
			for _, pair := range strings.Split(elem, ";") {
				k, val, ok := strings.Cut(strings.TrimSpace(pair), "=")
				if ok && strings.EqualFold(k, "for") {
					hops = append(hops, strings.Trim(val, `"`))
				}
			}
		}
	}
	return hops
}

// parseHop accepts "203.0.113.7", "203.0.113.7:443", "[2001:db8::1]:443" and "2001:db8::1".
func parseHop(h string) (netip.Addr, bool) {
	if ap, err := netip.ParseAddrPort(h); err == nil {
		return ap.Addr().Unmap(), true
	}
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	a, err := netip.ParseAddr(h)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}
