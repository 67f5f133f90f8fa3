package httpapi

import (
	"encoding/json"
	"testing"
)

// FuzzDecodeCheck: no input panics; an accepted request always satisfies the
// contract's bounds; a refusal always carries a 400 with a message.
func FuzzDecodeCheck(f *testing.F) {
	f.Fuzz(func(t *testing.T, body []byte) {
		req, apiErr := DecodeCheck(body)
		if apiErr != nil {
			if apiErr.Status != 400 || apiErr.Code != "invalid_request" || apiErr.Message == "" {
				t.Fatalf("refusal without a clear 400: %+v", apiErr)
			}
			return
		}
		if req.Key == "" || len(req.Key) > MaxKeyBytes || req.Scope == "" || len(req.Scope) > MaxScopeLen {
			t.Fatalf("accepted out-of-bounds key/scope: %+v", req)
		}
		if req.HasCost && (req.Cost < 0 || req.Cost > MaxCost) {
			t.Fatalf("accepted cost %d", req.Cost)
		}
		if !json.Valid(body) {
			t.Fatalf("accepted invalid JSON %q", body)
		}
	})
}
