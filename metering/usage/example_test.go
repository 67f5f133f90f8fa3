package usage_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/ratewarden/ratewarden/metering/usage"
)

// An operator issues a portal token for one key; the API verifies it.
func ExampleSigner() {
	s, err := usage.NewSigner([]byte("a secret of at least 16 bytes"))
	if err != nil {
		panic(err)
	}
	now := time.Date(2026, 7, 31, 9, 0, 0, 0, time.UTC)
	tok, claims, err := s.Issue("acct_8812", now, time.Hour)
	if err != nil {
		panic(err)
	}
	got, err := s.Verify(tok, now.Add(time.Minute))
	fmt.Println(got.Key, got.ExpiresAt(), got == claims, err)
	_, err = s.Verify(tok, now.Add(2*time.Hour))
	fmt.Println(errors.Is(err, usage.ErrTokenExpired))
	// Output:
	// acct_8812 2026-07-31 10:00:00 +0000 UTC true <nil>
	// true
}
