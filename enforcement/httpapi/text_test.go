package httpapi_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/ratewarden/ratewarden/enforcement/httpapi"
)

// TestKeyText: one rule for the text of a key, scope and tier: valid UTF-8
// without control characters. A NUL (escaped; raw it is not JSON), any
// other C0 control or DEL, or bytes that are not UTF-8 are refused with 400
// invalid_request naming the field; any other Unicode is accepted as sent.
func TestKeyText(t *testing.T) {
	h := httpapi.NewCheckHandler(newLimiter(t), "", nil)
	for _, c := range []struct {
		name, body string
		msg        string // "" = accepted
	}{
		{"escaped NUL in key", `{"key":"a\u0000b","scope":"s"}`, "key has a control character (U+0000) at byte 1"},
		{"raw NUL in key", "{\"key\":\"a\x00b\",\"scope\":\"s\"}", "not a JSON object"},
		{"newline in key", `{"key":"a\nb","scope":"s"}`, "key has a control character (U+000A)"},
		{"unit separator in scope", `{"key":"k","scope":"s\u001f"}`, "scope has a control character (U+001F)"},
		{"raw DEL in key", "{\"key\":\"a\x7fb\",\"scope\":\"s\"}", "key has a control character (U+007F)"},
		{"escaped DEL in tier", `{"key":"k","scope":"s","tier":"\u007f"}`, "tier has a control character (U+007F)"},
		{"invalid UTF-8 in key", "{\"key\":\"a\xffb\",\"scope\":\"s\"}", "key is not valid UTF-8"},
		{"truncated UTF-8 in scope", "{\"key\":\"k\",\"scope\":\"s\xc3\"}", "scope is not valid UTF-8"},
		{"overlong NUL in key", "{\"key\":\"a\xc0\x80\",\"scope\":\"s\"}", "key is not valid UTF-8"},
		{"invalid UTF-8 in tier", "{\"key\":\"k\",\"scope\":\"s\",\"tier\":\"\xfe\"}", "tier is not valid UTF-8"},
		{"invalid UTF-8, key spelled KEY", "{\"KEY\":\"\xff\",\"scope\":\"s\"}", "key is not valid UTF-8"},
		{"invalid UTF-8 in an ignored member", "{\"key\":\"k1\",\"scope\":\"s\",\"note\":\"\xff\"}", ""},
		{"accents", `{"key":"usér:é","scope":"s"}`, ""},
		{"escaped CJK and emoji", `{"key":"\u65e5\u672c\ud83d\ude00","scope":"s"}`, ""},
		{"spaces and punctuation", `{"key":"ip:2001:db8::1 / x","scope":"s"}`, ""},
		{"U+FFFD itself", `{"key":"\ufffd","scope":"s"}`, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := post(t, h, c.body)
			if c.msg == "" {
				if w.Code != 200 {
					t.Fatalf("refused: %d %s", w.Code, w.Body)
				}
				return
			}
			var e errorResponse
			if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil {
				t.Fatalf("body %q: %v", w.Body, err)
			}
			if w.Code != 400 || e.Error.Code != "invalid_request" || !strings.Contains(e.Error.Message, c.msg) {
				t.Fatalf("got %d %+v, want 400 invalid_request containing %q", w.Code, e.Error, c.msg)
			}
		})
	}
}

// TestBodyAtTheLimit: a valid body of exactly 64 KiB is decided; one byte
// more is 413, whether Content-Length says so or the body just runs on.
func TestBodyAtTheLimit(t *testing.T) {
	h := httpapi.NewCheckHandler(newLimiter(t), "", nil)
	body := func(n int) string {
		head := `{"key":"k","scope":"s","pad":"`
		return head + strings.Repeat("x", n-len(head)-2) + `"}`
	}
	if b := body(httpapi.MaxBodyBytes); len(b) != 64<<10 {
		t.Fatalf("body of %d bytes", len(b))
	}
	if w := post(t, h, body(httpapi.MaxBodyBytes)); w.Code != 200 {
		t.Fatalf("exactly 64 KiB: %d %s", w.Code, w.Body)
	}
	if w := post(t, h, body(httpapi.MaxBodyBytes+1)); w.Code != 413 {
		t.Fatalf("64 KiB + 1: %d %s", w.Code, w.Body)
	}
}

func TestTextProblem(t *testing.T) {
	for s, want := range map[string]string{
		"acct_8812": "", "é日本😀": "", " ": "", "\u0080": "", // U+0080 is C1, valid text here
		"\x00": "has a control character (U+0000) at byte 0", "ab\x1b[31m": "has a control character (U+001B) at byte 2",
		"\x7f": "has a control character (U+007F) at byte 0", "a\xff": "is not valid UTF-8 (byte 1)",
		"\xed\xa0\x80": "is not valid UTF-8 (byte 0)", // an encoded surrogate
	} {
		if got := httpapi.TextProblem(s); got != want {
			t.Errorf("TextProblem(%q) = %q, want %q", s, got, want)
		}
	}
}
