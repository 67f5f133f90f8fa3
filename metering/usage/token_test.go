package usage

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestTokenRoundTripAndRefusals(t *testing.T) {
	now := time.Date(2026, 7, 31, 9, 0, 0, 0, time.UTC)
	s, err := NewSigner([]byte(testSecret))
	if err != nil {
		t.Fatal(err)
	}
	tok, c, err := s.Issue("acct_1", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Verify(tok, now.Add(59*time.Minute))
	if err != nil || got != c || got.Key != "acct_1" || !validTokenID(got.ID) {
		t.Fatalf("verify: %+v %v (issued %+v)", got, err, c)
	}
	other, _ := NewSigner([]byte("another-secret-of-16+bytes"))
	dot := strings.LastIndexByte(tok, '.')
	forged, _ := other.Sign(Claims{ID: c.ID, Key: "acct_2", Expires: c.Expires})
	swapped := forged[:strings.LastIndexByte(forged, '.')] + tok[dot:] // claims of acct_2 with acct_1's signature
	flip := func(s string, i int) string {
		b := []byte(s)
		if b[i] == 'A' {
			b[i] = 'B'
		} else {
			b[i] = 'A'
		}
		return string(b)
	}
	for _, tc := range []struct {
		name string
		tok  string
		at   time.Time
		want error
	}{
		{"expired at exp", tok, c.ExpiresAt(), ErrTokenExpired},
		{"expired later", tok, now.Add(2 * time.Hour), ErrTokenExpired},
		{"signed by another secret", forged, now, ErrTokenSignature},
		{"claims swapped", swapped, now, ErrTokenSignature},
		{"payload byte flipped", flip(tok, len(tokenPrefix)+3), now, ErrTokenSignature},
		{"signature byte flipped", flip(tok, dot+3), now, ErrTokenSignature},
		{"signature cut", tok[:len(tok)-3], now, ErrTokenSignature},
		{"empty", "", now, ErrTokenMalformed},
		{"no prefix", tok[len(tokenPrefix):], now, ErrTokenMalformed},
		{"no signature", tok[:dot], now, ErrTokenMalformed},
		{"huge", tokenPrefix + strings.Repeat("a", 5000) + ".x", now, ErrTokenMalformed},
	} {
		if _, err := s.Verify(tc.tok, tc.at); !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
	}
	if _, err := NewSigner([]byte("short")); err == nil {
		t.Error("a 5-byte secret was accepted")
	}
}
