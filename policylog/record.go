// Package policylog is the policy control plane's domain: the records of
// the policy log (the policy document, per-key overrides, rollouts and
// their verdicts: rollout.go), the
// deterministic rule that applies them in log order, and the state they
// build (a document and its overrides at a revision). Every reader that
// applies the same records reaches the same state with no coordination.
// The log itself (a Kafka topic of one partition) is behind the small Log
// interface; package policylog/kafkalog is its adapter.
//
// # The apply rule
//
// A record carries its revision and the parent revision its writer saw.
// In log order, a record is applied when its content is valid (the
// document passes the validation of `limiter policy check`; an override
// passes policy.Override.Validate against the document in force) and
// revision = parent + 1 with parent = the head; else it is refused, with
// the same reason everywhere.
//
// # Compaction
//
// The topic is compacted in production: for each log key (`policy`,
// `override/<key>[/<scope>]`) only the latest record survives. Offsets
// survive compaction, so a reader sees where records were removed (a gap
// in offsets). Once past a gap, a record whose parent is ahead of the head
// is applied (its predecessors were superseded, not refused), so a
// compacted log replays to the state of the full one; on a log without a
// gap the strict rule holds. A writer whose record was refused rewrites the current record of
// the same log key (a restatement: same revision and content, naming the
// refused record; or "no override" when the key had none), so that
// compaction never keeps a refused record in place of the one in force. A
// restatement is a no-op on the full log; on a compacted one it puts back
// the record in force where the key holds an older one or the refused one
// (applied across a gap). A null value (a Kafka tombstone) changes no
// state: on a compacted log the key it removes is simply absent.
//
// What remains: a writer that dies between its refused record and its
// restatement leaves a record that a reader of a compacted log may apply
// across a gap. Writers check content and the head before writing, so a
// refusal needs two writers racing for one revision.
package policylog

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/ratewarden/ratewarden/policy"
)

// Record kinds.
const (
	KindPolicy   = "policy"   // the policy document (log key "policy")
	KindOverride = "override" // one override (log key "override/<key>[/<scope>]")
)

// DocumentKey is the log key of the policy document's records.
const DocumentKey = "policy"

// MaxRecord bounds a record's encoding (a document of policy.MaxFileSize
// and its envelope); a larger value is refused.
const MaxRecord = policy.MaxFileSize + 64<<10

// Record is one entry of the policy log; its JSON encoding is the Kafka
// record's value.
type Record struct {
	Revision int64     `json:"revision"`
	Parent   int64     `json:"parent"`
	Kind     string    `json:"kind"`
	Author   string    `json:"author"`
	Message  string    `json:"message"`
	Time     time.Time `json:"time"`
	// SHA256 is the hex SHA-256 of the content (Content): a reader refuses
	// a record whose content does not match it.
	SHA256 string `json:"sha256"`

	// Document is the policy file (YAML), for KindPolicy.
	Document string `json:"document,omitempty"`
	// Key and Scope name an override; Override is its value, absent when
	// Deleted.
	Key      string           `json:"key,omitempty"`
	Scope    string           `json:"scope,omitempty"`
	Override *policy.Override `json:"override,omitempty"`
	Deleted  bool             `json:"deleted,omitempty"`
	// Restates marks a copy of the record in force for its log key,
	// written after a refusal so that compaction keeps it (see the package
	// comment); it never changes the state of a full log.
	Restates bool `json:"restates,omitempty"`
	// RefusedRevision and RefusedSHA256 name the refused record that made
	// the writer restate: where a reader applied that record (across a
	// compaction gap it cannot tell a loser from a winner), the
	// restatement puts the record in force back. A restatement with
	// Deleted says the key had no override.
	RefusedRevision int64  `json:"refused_revision,omitempty"`
	RefusedSHA256   string `json:"refused_sha256,omitempty"`

	// Rollout is the trial a KindRollout record opens (its candidate is
	// Document); Verdict is a KindVerdict record's decision (Document is
	// the candidate when it promotes). See rollout.go.
	Rollout *Rollout `json:"rollout,omitempty"`
	Verdict *Verdict `json:"verdict,omitempty"`

	// Epoch and State belong to a KindEpoch record (epoch.go): the new
	// epoch it declares and the override records in force it carries
	// (Document is the document in force).
	Epoch int64    `json:"epoch,omitempty"`
	State []Record `json:"state,omitempty"`
	// Checkpoint belongs to a KindCheckpoint record (checkpoint.go).
	Checkpoint *Checkpoint `json:"checkpoint,omitempty"`
	// Sig is the id of the key that signed the record and its signature,
	// "<key id>:<base64>"; Signer.Encode appends it as the value's last
	// member whatever the order of the fields (keyring.go).
	Sig string `json:"sig,omitempty"`
}

// OverrideLogKey is the log key of an override: "override/<key>" or
// "override/<key>/<scope>", each part path-escaped (a "/" inside a key is
// %2F), so that the key and scope are read back unambiguously.
func OverrideLogKey(key, scope string) string {
	k := "override/" + url.PathEscape(key)
	if scope != "" {
		k += "/" + url.PathEscape(scope)
	}
	return k
}

// LogKey is the log key the record belongs under.
func (r *Record) LogKey() string {
	switch r.Kind {
	case KindOverride:
		return OverrideLogKey(r.Key, r.Scope)
	case KindRollout, KindVerdict:
		return r.rolloutLogKey()
	case KindEpoch:
		return EpochKey
	case KindCheckpoint:
		return CheckpointKey
	}
	return r.Kind
}

// Content is the bytes SHA256 covers: the document for KindPolicy; for an
// override its key, scope and value (JSON), or "deleted"; for a rollout or
// a verdict, the document with the rollout or verdict (JSON).
func (r *Record) Content() []byte {
	switch r.Kind {
	case KindPolicy:
		return []byte(r.Document)
	case KindOverride:
		v := "deleted"
		if !r.Deleted && r.Override != nil {
			b, _ := json.Marshal(r.Override) // a struct of plain fields always marshals
			v = string(b)
		}
		b, _ := json.Marshal([]string{r.Key, r.Scope, v})
		return b
	case KindRollout, KindVerdict:
		return r.rolloutContent()
	case KindEpoch:
		return r.epochContent()
	case KindCheckpoint:
		return r.checkpointContent()
	}
	return nil
}

// Seal sets SHA256 from the content.
func (r *Record) Seal() { r.SHA256 = hashHex(r.Content()) }

func hashHex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// Subject describes what the record changes, for history and audit:
// "policy", or "override <key>[ scope <scope>]".
func (r *Record) Subject() string {
	if r.Kind == KindRollout || r.Kind == KindVerdict {
		return r.rolloutSubject()
	}
	if r.Kind != KindOverride {
		return r.Kind
	}
	s := "override " + r.Key
	if r.Scope != "" {
		s += " scope " + r.Scope
	}
	return s
}

// Encode is the record's log value.
func (r *Record) Encode() ([]byte, error) { return json.Marshal(r) }

// ErrGarbled marks a log value that is not a well-formed record.
var ErrGarbled = errors.New("garbled record")

// Decode reads a log value under log key key, checking what no later step
// can: the shape, the kind, the log key and the content hash.
func Decode(key string, value []byte) (Record, error) {
	if len(value) > MaxRecord {
		return Record{}, fmt.Errorf("%w: %d bytes, more than %d", ErrGarbled, len(value), MaxRecord)
	}
	if r, ok := decodeOverride(value); ok && r.LogKey() == key {
		return r, nil
	}
	return decodeJSON(key, value)
}

// decodeJSON is Decode through encoding/json, for every record
// decodeOverride does not take.
func decodeJSON(key string, value []byte) (Record, error) {
	var r Record
	dec := json.NewDecoder(bytes.NewReader(value))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return Record{}, fmt.Errorf("%w: %v", ErrGarbled, err)
	}
	switch r.Kind {
	case KindPolicy, KindOverride, KindRollout, KindVerdict, KindEpoch, KindCheckpoint:
	default:
		return r, fmt.Errorf("%w: unknown kind %q", ErrGarbled, r.Kind)
	}
	if r.Kind == KindOverride && r.Key == "" {
		return r, fmt.Errorf("%w: an override without a key", ErrGarbled)
	}
	if err := decodeRollout(&r); err != nil {
		return r, fmt.Errorf("%w: %v", ErrGarbled, err)
	}
	if err := decodeEpoch(&r); err != nil {
		return r, fmt.Errorf("%w: %v", ErrGarbled, err)
	}
	if err := decodeCheckpoint(&r); err != nil {
		return r, fmt.Errorf("%w: %v", ErrGarbled, err)
	}
	if lk := r.LogKey(); lk != key {
		return r, fmt.Errorf("%w: filed under log key %q, belongs under %q", ErrGarbled, key, lk)
	}
	if h := hashHex(r.Content()); h != r.SHA256 {
		return r, fmt.Errorf("%w: content SHA-256 %s does not match the recorded %s", ErrGarbled, h, r.SHA256)
	}
	return r, nil
}
