package bearer

import "testing"

func TestAllows(t *testing.T) {
	c := NewChecker("s3cret")
	for _, tc := range []struct {
		header string
		want   bool
	}{
		{"Bearer s3cret", true},
		{"bearer s3cret", true}, // the scheme is case-insensitive (RFC 9110, 11.1)
		{"BEARER s3cret", true},
		{"Bearer   s3cret  ", true}, // 1*SP, and surrounding white space
		{" Bearer s3cret", true},
		{"Bearer S3cret", false}, // the token is not
		{"Bearer s3cret2", false},
		{"Bearer s3cre", false},
		{"Bearers3cret", false},
		{"Bearer\ts3cret", false},
		{"Basic s3cret", false},
		{"s3cret", false},
		{"Bearer ", false},
		{"Bearer", false},
		{"", false},
	} {
		if got := c.Allows(tc.header); got != tc.want {
			t.Errorf("Allows(%q) = %v, want %v", tc.header, got, tc.want)
		}
	}
	var zero Checker
	for _, h := range []string{"Bearer ", "Bearer x", ""} {
		if zero.Allows(h) || NewChecker("").Allows(h) {
			t.Errorf("a checker without a token allowed %q", h)
		}
	}
}

func TestToken(t *testing.T) {
	for _, tc := range []struct {
		header, token string
		ok            bool
	}{
		{"Bearer abc.def", "abc.def", true},
		{"bearer  abc ", "abc", true},
		{"Basic abc", "", false},
		{"Bearer", "", false},
		{"Bearer    ", "", false},
	} {
		if tok, ok := Token(tc.header); tok != tc.token || ok != tc.ok {
			t.Errorf("Token(%q) = %q, %v, want %q, %v", tc.header, tok, ok, tc.token, tc.ok)
		}
	}
}

func TestEqual(t *testing.T) {
	c := NewChecker("abc")
	if !c.Equal("abc") || c.Equal("abd") || c.Equal("") || c.Equal("abcd") || c.Equal("ab") {
		t.Fatal("Equal is wrong")
	}
	if (Checker{}).Equal("") || NewChecker("").Equal("") {
		t.Fatal("a checker without a token matched the empty token")
	}
}
