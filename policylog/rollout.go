package policylog

// Rollouts: a candidate document enters as the fleet's shadow policy for a
// while (a KindRollout record, log key "rollout"), and one verdict
// (KindVerdict) ends it: promote makes the candidate the document in force,
// withdraw leaves the document as it was.
//
// The apply rule, for what concerns rollouts:
//   - A rollout is refused while another one is open, and before any
//     document is in force; its candidate passes the document validation
//     and must not drop a tier an override uses.
//   - A verdict is applied only to the open rollout it names: a second
//     verdict for the same rollout (two judges racing through a
//     rebalance), or one for a rollout a push superseded, is refused
//     (CodeConflict) with the same reason everywhere.
//   - A document pushed while a rollout is open is applied and supersedes
//     the rollout: the shadow ends with no verdict. A push is how an
//     operator fixes production now; refusing it until a trial ends would
//     hold an emergency change hostage to a 15-minute window, and a trial
//     measured against a baseline that changed midway means nothing.
//     Overrides neither end nor wait for a rollout.
//
// Compaction: a promote verdict changes the document, so it is filed
// under log key "policy" and carries the candidate (it is the document's
// record in force until the next push); a withdraw verdict is filed under
// "rollout", where it supersedes the rollout's record. Either way a
// compacted log replays to the same document and the same open or closed
// rollout.

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ratewarden/ratewarden/policy"
)

// Rollout record kinds and their log key.
const (
	KindRollout = "rollout" // a candidate in shadow (log key "rollout")
	KindVerdict = "verdict" // a rollout's verdict (log key "policy" for promote, "rollout" for withdraw)
	RolloutKey  = "rollout"
)

// Verdict decisions.
const (
	Promote  = "promote"
	Withdraw = "withdraw"
)

// MaxShadowFor bounds a rollout's shadow window.
const MaxShadowFor = 7 * 24 * time.Hour

// Rollout is what a KindRollout record asks: evaluate its Document as the
// fleet's shadow policy until EndsAt, then promote it if at most
// MaxNewlyRejected (a fraction, 0.005 = 0.5%) of the decisions evaluated
// under it were allowed by the policy in force but denied by the
// candidate.
type Rollout struct {
	ShadowFor        string    `json:"shadow_for"` // a Go duration, as given
	EndsAt           time.Time `json:"ends_at"`    // the record's Time + ShadowFor
	MaxNewlyRejected float64   `json:"max_newly_rejected"`
}

// Verdict is what a KindVerdict record decides about rollout Rollout (its
// revision), with what the judge measured: of Decisions evaluated under
// the candidate, NewlyRejected were allowed by the policy in force but
// denied by the candidate; Share = NewlyRejected / Decisions (0 when
// there were none).
type Verdict struct {
	Rollout          int64   `json:"rollout"`
	Decision         string  `json:"decision"` // Promote or Withdraw
	Decisions        uint64  `json:"decisions"`
	NewlyRejected    uint64  `json:"newly_rejected"`
	Share            float64 `json:"share"`
	MaxNewlyRejected float64 `json:"max_newly_rejected"`
	// Reason says why, in words ("0.12% newly rejected, bound 0.5%").
	Reason string `json:"reason"`
}

func (r *Record) rolloutContent() []byte {
	var b []byte
	switch r.Kind {
	case KindRollout:
		b, _ = json.Marshal(struct {
			D string   `json:"document"`
			R *Rollout `json:"rollout"`
		}{r.Document, r.Rollout})
	case KindVerdict:
		b, _ = json.Marshal(struct {
			D string   `json:"document"`
			V *Verdict `json:"verdict"`
		}{r.Document, r.Verdict})
	}
	return b
}

func (r *Record) rolloutLogKey() string {
	if r.Kind == KindVerdict && r.Verdict != nil && r.Verdict.Decision == Promote {
		return DocumentKey
	}
	return RolloutKey
}

func (r *Record) rolloutSubject() string {
	if r.Kind == KindRollout {
		if r.Rollout == nil {
			return "rollout"
		}
		return fmt.Sprintf("rollout (shadow %s, max %s)", r.Rollout.ShadowFor, FormatShare(r.Rollout.MaxNewlyRejected))
	}
	if r.Verdict == nil {
		return "verdict"
	}
	return fmt.Sprintf("verdict %s rollout %d (%s newly rejected)", r.Verdict.Decision, r.Verdict.Rollout, FormatShare(r.Verdict.Share))
}

// changesDocument reports whether applying r installs its Document as the
// document in force.
func (r *Record) changesDocument() bool {
	return r.Kind == KindPolicy || (r.Kind == KindVerdict && r.Verdict != nil && r.Verdict.Decision == Promote)
}

// FormatShare prints a fraction as a percentage ("0.5%").
func FormatShare(f float64) string { return fmt.Sprintf("%.4g%%", f*100) }

func decodeRollout(r *Record) error {
	switch r.Kind {
	case KindRollout:
		if r.Rollout == nil {
			return errors.New("a rollout record without a rollout")
		}
	case KindVerdict:
		if r.Verdict == nil {
			return errors.New("a verdict record without a verdict")
		}
		if r.Verdict.Decision != Promote && r.Verdict.Decision != Withdraw {
			return fmt.Errorf("verdict %q is not promote or withdraw", r.Verdict.Decision)
		}
	}
	return nil
}

// OpenRollout is the rollout in force: its record and the candidate.
type OpenRollout struct {
	Record    Record
	Candidate *policy.Policy
}

// rollouts is the rollout part of a State.
type rollouts struct {
	open *OpenRollout
	// last is the highest rollout revision applied (open or closed).
	last int64
	// closedBy: per rollout recently closed, the record that closed it
	// (a verdict, or the push that superseded it), for the reasons of
	// refusals.
	closedBy map[int64]Meta
	// rec is the record in force of log key "rollout" (a rollout or a
	// withdraw verdict), which a writer restates after a refusal.
	rec *Record
}

// Rollout is the open rollout, if any.
func (s *State) Rollout() (OpenRollout, bool) {
	if s.ro.open == nil {
		return OpenRollout{}, false
	}
	return *s.ro.open, true
}

// ClosedBy is the record that closed rollout rev (its verdict, or the
// push that superseded it), when still remembered.
func (s *State) ClosedBy(rev int64) (Meta, bool) {
	m, ok := s.ro.closedBy[rev]
	return m, ok
}

// validateRollout checks a rollout or verdict record against the state.
func (s *State) validateRollout(rec *Record) error {
	if err := decodeRollout(rec); err != nil {
		return err
	}
	switch rec.Kind {
	case KindRollout:
		ro := rec.Rollout
		d, err := time.ParseDuration(ro.ShadowFor)
		if err != nil || d <= 0 || d > MaxShadowFor {
			return fmt.Errorf("shadow_for %q: a duration above 0 and at most %s", ro.ShadowFor, MaxShadowFor)
		}
		if !ro.EndsAt.After(rec.Time) {
			return fmt.Errorf("ends_at %s is not after the record's time %s", ro.EndsAt.Format(time.RFC3339), rec.Time.Format(time.RFC3339))
		}
		if !(ro.MaxNewlyRejected >= 0 && ro.MaxNewlyRejected <= 1) {
			return fmt.Errorf("max_newly_rejected %v: a fraction from 0 to 1", ro.MaxNewlyRejected)
		}
		if o := s.ro.open; o != nil {
			return fmt.Errorf("rollout %d is open until %s: wait for its verdict, or push a document (which supersedes it)",
				o.Record.Revision, o.Record.Rollout.EndsAt.Format(time.RFC3339))
		}
		if s.doc == nil && !s.compacted {
			return errors.New("no policy document yet: push one before a rollout")
		}
		return s.validateDocument(rec.Document)
	case KindVerdict:
		v := rec.Verdict
		if o := s.ro.open; o == nil || o.Record.Revision != v.Rollout {
			// On a compacted log the rollout's own record may be gone
			// (superseded under its log key): a verdict for a rollout past
			// every one seen, and not known closed, is taken as its own.
			if _, closed := s.ro.closedBy[v.Rollout]; !(s.compacted && !closed && v.Rollout > s.ro.last) {
				return errAlreadyDecided
			}
		}
		if v.Decision == Promote {
			return s.validateDocument(rec.Document)
		}
	}
	return nil
}

// errAlreadyDecided marks a verdict for a rollout that is not open; Apply
// turns it into a conflict naming what closed the rollout.
var errAlreadyDecided = errors.New("the rollout is not open")

// decidedReason says why a verdict for a rollout that is not open is
// refused.
func (s *State) decidedReason(v *Verdict) string {
	if m, ok := s.ro.closedBy[v.Rollout]; ok {
		return fmt.Sprintf("rollout %d was already closed at revision %d by %s (%s: %q)", v.Rollout, m.Revision, m.Author, m.Subject, m.Message)
	}
	if o := s.ro.open; o != nil {
		return fmt.Sprintf("rollout %d is not open (the open rollout is %d)", v.Rollout, o.Record.Revision)
	}
	return fmt.Sprintf("rollout %d is not open (no rollout is)", v.Rollout)
}

// installRollout applies a validated rollout record, or the rollout part
// of a document change (which closes the open rollout).
func (s *State) installRollout(rec Record) {
	if s.ro.closedBy == nil {
		s.ro.closedBy = map[int64]Meta{}
	}
	closeRollout := func(rev int64) {
		s.ro.closedBy[rev] = metaOf(&rec)
		delete(s.ro.closedBy, rev-recentKept)
		if s.ro.open != nil && s.ro.open.Record.Revision == rev {
			s.ro.open = nil
		}
	}
	switch rec.Kind {
	case KindRollout:
		p, _ := policy.Parse([]byte(rec.Document)) // validated just before
		r := rec
		s.ro.open = &OpenRollout{Record: r, Candidate: p}
		s.ro.last = max(s.ro.last, rec.Revision)
		s.ro.rec = &r
	case KindVerdict:
		closeRollout(rec.Verdict.Rollout)
		s.ro.last = max(s.ro.last, rec.Verdict.Rollout)
		if rec.Verdict.Decision == Withdraw {
			r := rec
			s.ro.rec = &r
		}
	case KindPolicy:
		if s.ro.open != nil {
			closeRollout(s.ro.open.Record.Revision) // superseded by the push
		}
	}
}

// restateRollout applies a restatement of log key "rollout" (see the
// package comment) where the state lacks what it restates: a rollout past
// every one seen opens, a withdraw of the open rollout closes it; on the
// full log it is always a no-op.
func (s *State) restateRollout(rec Record) Outcome {
	ignored := Outcome{Result: Ignored, Record: rec, Head: s.head}
	if err := decodeRollout(&rec); err != nil {
		return s.refuse(rec, CodeGarbled, err.Error())
	}
	switch rec.Kind {
	case KindRollout:
		if rec.Revision <= s.ro.last || s.ro.open != nil {
			return ignored
		}
		if _, err := policy.Parse([]byte(rec.Document)); err != nil {
			return s.refuse(rec, CodeInvalid, err.Error())
		}
	case KindVerdict:
		if s.ro.open == nil || s.ro.open.Record.Revision != rec.Verdict.Rollout {
			return ignored
		}
	}
	s.installRollout(rec)
	s.head = max(s.head, rec.Revision)
	return Outcome{Result: Applied, Record: rec, Head: s.head}
}

// CandidateSnapshot is the open rollout's candidate with the overrides in
// force, as the limiter evaluates it in shadow (nil when no rollout is
// open); now is the clock of expiry.
func (s *State) CandidateSnapshot(now func() time.Time) *policy.WithOverrides {
	if s.ro.open == nil {
		return nil
	}
	return policy.NewWithOverrides(s.ro.open.Candidate, s.ov.Clone(), now)
}
