package support

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/keyslot"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/policylog"
)

// ResetRequest is what an operator signs to reset a key (`limiter key
// reset`): its exact JSON bytes are the signed document.
type ResetRequest struct {
	ID     string             `json:"id"` // random: a reset sent twice applies once
	Key    string             `json:"key"`
	Scope  string             `json:"scope"`
	Op     redisstore.ResetOp `json:"op"`
	Grant  int64              `json:"grant,omitempty"`
	Reason string             `json:"reason"`
	Author string             `json:"author,omitempty"` // who the key holder acts for (policylog.AuthorOf)
	Time   time.Time          `json:"time"`
}

// SignedReset is POST /admin/keys/reset's body: the document as signed
// and its signature (policylog.Signer.SignDocument).
type SignedReset struct {
	Doc string `json:"doc"`
	Sig string `json:"sig"`
}

// NewResetID is a fresh reset id.
func NewResetID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}

// Sign is the signed form of req under s.
func Sign(s *policylog.Signer, req ResetRequest) (SignedReset, error) {
	doc, err := json.Marshal(req)
	if err != nil {
		return SignedReset{}, err
	}
	return SignedReset{Doc: string(doc), Sig: s.SignDocument(doc)}, nil
}

// MaxSkew is how far a reset's time may be from the limiter's clock: an
// old signed reset cannot be sent again later.
const MaxSkew = 5 * time.Minute

// Refusal codes of a reset.
const (
	CodeUnauthenticated = "unauthenticated" // not signed by a key of POLICY_TRUSTED_KEYS_FILE, or altered
	CodeForbidden       = "forbidden"       // the key's role may not reset
	CodeReasonRequired  = "reason_required"
	CodeInvalid         = "invalid_request"
	CodeStale           = "stale"    // the signed time is too far from now
	CodeReplayed        = "replayed" // this reset was applied before
	CodeNoKeyring       = "no_keyring"
	CodeUnavailable     = "store_unavailable"
)

// Refused is a reset refused, with its code.
type Refused struct {
	Code, Reason string
}

func (r *Refused) Error() string { return r.Code + ": " + r.Reason }

// Audit is one audit record of a reset, applied or refused, as stored
// newest first on the key's list (keyslot.ResetLogKey) and shown by
// inspect. Before and After are added by the store's script.
type Audit struct {
	ID      string             `json:"id"`
	Time    time.Time          `json:"time"`
	Author  string             `json:"author"`
	Role    string             `json:"role,omitempty"`
	Key     string             `json:"key"`
	Scope   string             `json:"scope"`
	Op      redisstore.ResetOp `json:"op"`
	Grant   int64              `json:"grant,omitempty"`
	Reason  string             `json:"reason"`
	Result  string             `json:"result"` // applied | refused
	Code    string             `json:"code,omitempty"`
	Refusal string             `json:"refusal,omitempty"`
	By      string             `json:"by"` // the limiter instance that judged it
}

// Resetter judges and applies resets on a limiter. Safe for concurrent
// use.
type Resetter struct {
	// Keys is POLICY_TRUSTED_KEYS_FILE; nil refuses every reset.
	Keys *policylog.Keyring
	// Policy is the policy in force, which names the key's bucket.
	Policy func() enforcement.Policy
	// Stores are the shared stores, the default one first.
	Stores []StoreRef
	// Forget drops this limiter's own local view at once (the others
	// hear the store's announcement).
	Forget func(key, scope string)
	// Instance names this limiter in the audit.
	Instance string
	// Usage, optional, emits the usage event of an applied quota reset
	// (metering.KindReset), so that the key's usage history explains it.
	Usage func(key, scope, id string, res enforcement.Resolved, at time.Time)
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// StoreRef is one shared store.
type StoreRef struct {
	Name  string // "" or limits.DefaultStore for the default one
	Store *redisstore.Store
}

func (r *Resetter) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *Resetter) storeOf(name string) *redisstore.Store {
	for i, s := range r.Stores {
		if (name == "" && i == 0) || (name != "" && s.Name == name) {
			return s.Store
		}
	}
	return nil
}

// Apply judges sr and applies it. Every reset that names a key is
// audited on the key's list, applied or refused; the record is returned
// either way, with a *Refused error for a refusal.
func (r *Resetter) Apply(ctx context.Context, sr SignedReset) (json.RawMessage, error) {
	var req ResetRequest
	if err := json.Unmarshal([]byte(sr.Doc), &req); err != nil || req.Key == "" || req.Scope == "" {
		return nil, &Refused{CodeInvalid, "doc is not a reset request naming a key and a scope"}
	}
	a := Audit{ID: req.ID, Time: r.now().UTC(), Key: req.Key, Scope: req.Scope, Op: req.Op, Grant: req.Grant,
		Reason: req.Reason, By: r.Instance, Author: "unauthenticated"}
	if req.Author != "" {
		a.Author = "unauthenticated (claims " + req.Author + ")"
	}
	res, ref := r.judge(sr, req, &a)
	lim := res.Limit
	st := r.storeOf(lim.Store)
	if ref == nil && st == nil {
		ref = &Refused{CodeInvalid, fmt.Sprintf("the key's limit names store %q, which this limiter lacks", lim.Store)}
	}
	if st == nil {
		st = r.storeOf("")
	}
	if st == nil {
		return nil, &Refused{CodeUnavailable, "this limiter has no shared store (single-node mode): nothing to reset"}
	}
	if ref != nil {
		a.Result, a.Code, a.Refusal = "refused", ref.Code, ref.Reason
		b, _ := json.Marshal(a)
		if err := st.Audit(ctx, req.Key, b); err != nil {
			ref.Reason += " (and the refusal could not be audited: " + err.Error() + ")"
		}
		return b, ref
	}
	a.Result = "applied"
	b, _ := json.Marshal(a)
	rec, err := st.Reset(ctx, req.Key, req.Scope, lim, req.Op, req.Grant, req.ID, b)
	if errors.Is(err, redisstore.ErrResetApplied) {
		return nil, &Refused{CodeReplayed, "reset " + req.ID + " was applied before; nothing changed"}
	}
	if err != nil {
		return nil, &Refused{CodeUnavailable, err.Error()}
	}
	if r.Forget != nil {
		r.Forget(req.Key, req.Scope)
	}
	if req.Op == redisstore.ResetQuota && r.Usage != nil {
		r.Usage(req.Key, req.Scope, req.ID, res, a.Time)
	}
	return rec, nil
}

// judge checks the signature, the role, the reason, the time and the
// operation, filling the audit's author; it returns the key's limit.
func (r *Resetter) judge(sr SignedReset, req ResetRequest, a *Audit) (enforcement.Resolved, *Refused) {
	var lim enforcement.Resolved
	if r.Keys == nil {
		return lim, &Refused{CodeNoKeyring, "resets need POLICY_TRUSTED_KEYS_FILE on the limiter: nobody can be authenticated without it"}
	}
	identity, role, err := r.Keys.VerifyDocument([]byte(sr.Doc), sr.Sig)
	if err != nil {
		return lim, &Refused{CodeUnauthenticated, err.Error()}
	}
	a.Author, a.Role = policylog.AuthorOf(identity, req.Author), role
	if role != policylog.RoleWriter && role != policylog.RoleSupport {
		return lim, &Refused{CodeForbidden, fmt.Sprintf("%s has role %q, which may not reset keys (roles %s and %s may)", identity, role, policylog.RoleSupport, policylog.RoleWriter)}
	}
	if strings.TrimSpace(req.Reason) == "" {
		return lim, &Refused{CodeReasonRequired, "a reset must say why (--reason)"}
	}
	if d := r.now().Sub(req.Time); d > MaxSkew || d < -MaxSkew {
		return lim, &Refused{CodeStale, fmt.Sprintf("signed at %s, more than %v from this limiter's clock", req.Time.Format(time.RFC3339), MaxSkew)}
	}
	if !req.Op.Valid() || (req.Op == redisstore.ResetGrant) != (req.Grant > 0) || req.ID == "" {
		return lim, &Refused{CodeInvalid, fmt.Sprintf("op %q (grant %d, id %q): want refill, grant with N > 0, clear-debt or quota, and an id", req.Op, req.Grant, req.ID)}
	}
	res, err := r.Policy().Resolve(req.Key, req.Scope, "")
	if err != nil {
		return lim, &Refused{CodeInvalid, "resolve the key's limit: " + err.Error()}
	}
	if req.Op == redisstore.ResetQuota && !res.HasQuota() {
		return res, &Refused{CodeInvalid, "the key's limit has no quota"}
	}
	return res, nil
}

// Listen drops this limiter's local view of every key a reset is
// announced for on rdb (keyslot.ResetChannel of prefix), until ctx ends.
// The client resubscribes after a lost connection; a limiter that cannot
// reach the store meanwhile decides degraded and forgets what the store
// told it anyway (enforcement's store epoch).
func Listen(ctx context.Context, rdb redis.UniversalClient, prefix string, forget func(key, scope string)) error {
	ps := rdb.Subscribe(ctx, keyslot.ResetChannel(prefix))
	defer ps.Close()
	ch := ps.Channel()
	for {
		select {
		case <-ctx.Done():
			return nil
		case m, ok := <-ch:
			if !ok {
				return nil
			}
			if key, scope, ok := redisstore.ParseAnnouncement(m.Payload); ok {
				forget(key, scope)
			}
		}
	}
}
