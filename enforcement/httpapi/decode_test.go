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
		if p := TextProblem(req.Key) + TextProblem(req.Scope) + TextProblem(req.Tier); p != "" {
			t.Fatalf("accepted a key, scope or tier that %s: %+v", p, req)
		}
		if req.HasCost && (req.Cost < 0 || req.Cost > MaxCost) {
			t.Fatalf("accepted cost %d", req.Cost)
		}
		if !json.Valid(body) {
			t.Fatalf("accepted invalid JSON %q", body)
		}
	})
}

// FuzzScanAgreesWithJSON: whenever the fast scanner accepts a body, the
// general decoder reads the same request (or refuses it the same way).
func FuzzScanAgreesWithJSON(f *testing.F) {
	for _, s := range []string{
		`{"key":"k","scope":"s"}`, `{"key":"k","scope":"s","cost":10,"tier":"pro"}`,
		` { "cost" : 0 , "key":"k" , "scope" : "s" } `, `{"key":"k","scope":"s","cost":-1}`,
		`{"key":"k","scope":"s","cost":01}`, `{"key":null,"scope":"s"}`, `{}`, `{"key":"é","scope":"s"}`,
		`{"key":"k","key":"j","scope":"s"}`, `{"KEY":"k","scope":"s"}`, `{"key":"k","scope":"s"}x`,
		"{\"key\":\"a\x7f\",\"scope\":\"s\"}", `{"key":"a\u0000","scope":"s"}`, "{\"key\":\"\xff\",\"scope\":\"s\"}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		fast, ok := scanCheck(body)
		if !ok {
			return
		}
		var slow checkBody
		if apiErr := decodeCheckJSON(body, &slow); apiErr != nil {
			t.Fatalf("scanner accepted %q, encoding/json refused it: %v", body, apiErr)
		}
		r1, e1 := validateCheck(&fast)
		r2, e2 := validateCheck(&slow)
		if r1 != r2 || (e1 == nil) != (e2 == nil) || (e1 != nil && *e1 != *e2) {
			t.Fatalf("%q: scanner %+v %v, encoding/json %+v %v", body, r1, e1, r2, e2)
		}
	})
}

// FuzzScanSettleAgreesWithJSON: whenever the /settle scanner accepts a
// body, the general decoder reads the same id and cost (or refuses it the
// same way).
func FuzzScanSettleAgreesWithJSON(f *testing.F) {
	for _, s := range []string{
		`{"reservation":"AbC","cost":742}`, ` { "cost" : 0 , "reservation" : "x" } `, `{"reservation":"","cost":1}`,
		`{"reservation":"x","cost":-1}`, `{"reservation":"x","cost":01}`, `{"reservation":"x","cost":1000000001}`,
		`{"reservation":"x","reservation":"y","cost":1}`, `{"RESERVATION":"x","cost":1}`, `{"reservation":"x"}`,
		`{"reservation":"x","cost":1}x`, `{"reservation":"a\u0000","cost":1}`, "{\"reservation\":\"\xff\",\"cost\":1}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if _, _, ok := scanSettle(body); !ok {
			return
		}
		id1, c1, e1 := DecodeSettle(body)
		id2, c2, e2 := decodeSettleJSON(body)
		if id1 != id2 || c1 != c2 || (e1 == nil) != (e2 == nil) || (e1 != nil && *e1 != *e2) {
			t.Fatalf("%q: scanner %q %d %v, encoding/json %q %d %v", body, id1, c1, e1, id2, c2, e2)
		}
	})
}
