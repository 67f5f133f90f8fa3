package notify

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Standard Webhooks signing (https://www.standardwebhooks.com): the secret
// is "whsec_" + base64 of the key; the signed content is
// "<webhook-id>.<webhook-timestamp>.<body>"; the webhook-signature header is
// "v1,<base64 HMAC-SHA256>" (several space-separated signatures may be sent
// during a secret rotation; this sender sends one).

// Header names of a signed webhook.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// ParseSecret decodes a "whsec_<base64>" secret into the HMAC key.
func ParseSecret(s string) ([]byte, error) {
	b64, ok := strings.CutPrefix(s, "whsec_")
	if !ok {
		return nil, errors.New(`webhook secret must look like "whsec_<base64>"`)
	}
	key, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil, fmt.Errorf("webhook secret: the part after whsec_ is not base64: %w", err)
	}
	if len(key) < 16 {
		return nil, fmt.Errorf("webhook secret: key must be at least 16 bytes, got %d", len(key))
	}
	return key, nil
}

// Sign returns the webhook-signature header value for one message.
func Sign(key []byte, id string, ts time.Time, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id))
	m.Write([]byte("."))
	m.Write([]byte(strconv.FormatInt(ts.Unix(), 10)))
	m.Write([]byte("."))
	m.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// SetHeaders sets the three Standard Webhooks headers on h.
func SetHeaders(h http.Header, key []byte, id string, ts time.Time, body []byte) {
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, strconv.FormatInt(ts.Unix(), 10))
	h.Set(HeaderSignature, Sign(key, id, ts, body))
}

// Verification errors.
var (
	ErrNoSignature  = errors.New("webhook: missing id, timestamp or signature header")
	ErrBadTimestamp = errors.New("webhook: timestamp outside the tolerance")
	ErrBadSignature = errors.New("webhook: no matching signature")
)

// Verify checks a received webhook the way a receiver should: the headers
// are present, the timestamp is within tolerance of now (replay defence),
// and one of the v1 signatures matches (constant-time comparison).
func Verify(key []byte, h http.Header, body []byte, now time.Time, tolerance time.Duration) error {
	id, tsText, sigs := h.Get(HeaderID), h.Get(HeaderTimestamp), h.Get(HeaderSignature)
	if id == "" || tsText == "" || sigs == "" {
		return ErrNoSignature
	}
	sec, err := strconv.ParseInt(tsText, 10, 64)
	if err != nil {
		return ErrBadTimestamp
	}
	ts := time.Unix(sec, 0)
	if d := now.Sub(ts); d > tolerance || d < -tolerance {
		return ErrBadTimestamp
	}
	want := []byte(Sign(key, id, ts, body))
	for _, s := range strings.Fields(sigs) {
		if hmac.Equal([]byte(s), want) {
			return nil
		}
	}
	return ErrBadSignature
}
