package policylog

import (
	"context"
	"fmt"
	"time"

	"github.com/ratewarden/ratewarden/policy"
)

// The writes every writer makes (the limiter's CLI, usage-api's operator
// API): each returns once its record is read back as applied, or with a
// *Refusal saying why.

// Push writes document as the next revision of the policy.
func (c *Client) Push(ctx context.Context, document, author, message string, expect int64) (Outcome, error) {
	return c.Write(ctx, Record{Kind: KindPolicy, Document: document, Author: author, Message: message}, expect)
}

// Rollback pushes again the document that was in force at revision rev.
func (c *Client) Rollback(ctx context.Context, rev int64, author, message string) (Outcome, error) {
	if err := c.Sync(ctx); err != nil {
		return Outcome{}, fmt.Errorf("read the policy log: %w", err)
	}
	h, ok := c.DocumentAt(rev)
	if !ok {
		return Outcome{}, fmt.Errorf("no document in force at revision %d in the log (before the first, or compacted away: push the file instead)", rev)
	}
	if message == "" {
		message = fmt.Sprintf("rollback to revision %d", rev)
	}
	return c.Push(ctx, h.Document, author, message, NoExpect)
}

// DocumentAt is the document record in force at revision rev: the last
// applied document of a revision ≤ rev, among the records read.
func (c *Client) DocumentAt(rev int64) (HistoryItem, bool) {
	var found HistoryItem
	ok := false
	for _, h := range c.history {
		if h.Result == Applied && h.Document != "" && h.Revision <= rev && h.Revision >= found.Revision {
			found, ok = h, true
		}
	}
	return found, ok
}

// SetOverride writes the override of (key, scope).
func (c *Client) SetOverride(ctx context.Context, key, scope string, o policy.Override, author, message string, expect int64) (Outcome, error) {
	if message == "" {
		message = o.Reason
	}
	return c.Write(ctx, Record{Kind: KindOverride, Key: key, Scope: scope, Override: &o, Author: author, Message: message}, expect)
}

// DeleteOverride deletes the override of (key, scope); reason is the
// record's message.
func (c *Client) DeleteOverride(ctx context.Context, key, scope, author, reason string) (Outcome, error) {
	return c.Write(ctx, Record{Kind: KindOverride, Key: key, Scope: scope, Deleted: true, Author: author, Message: reason}, NoExpect)
}

// StartRollout writes a rollout: document enters as the fleet's shadow
// policy for shadowFor, after which the judge promotes it if at most
// maxNewlyRejected (a fraction) of the decisions evaluated under it would
// have been newly rejected. The rollout's revision is the outcome's Head.
func (c *Client) StartRollout(ctx context.Context, document string, shadowFor time.Duration, maxNewlyRejected float64, author, message string, expect int64) (Outcome, error) {
	now := time.Now().UTC()
	return c.Write(ctx, Record{Kind: KindRollout, Document: document, Author: author, Message: message, Time: now,
		Rollout: &Rollout{ShadowFor: shadowFor.String(), EndsAt: now.Add(shadowFor), MaxNewlyRejected: maxNewlyRejected}}, expect)
}

// Decide writes the verdict v about the open rollout v.Rollout (a promote
// carries its candidate). A verdict for a rollout that is not open (already
// decided, or superseded by a push) is a *Refusal with CodeConflict.
func (c *Client) Decide(ctx context.Context, v Verdict, author, message string) (Outcome, error) {
	if err := c.Sync(ctx); err != nil {
		return Outcome{}, fmt.Errorf("read the policy log: %w", err)
	}
	rec := Record{Kind: KindVerdict, Verdict: &v, Author: author, Message: message}
	if o, ok := c.st.Rollout(); ok && o.Record.Revision == v.Rollout && v.Decision == Promote {
		rec.Document = o.Record.Document
	}
	return c.Write(ctx, rec, NoExpect)
}
