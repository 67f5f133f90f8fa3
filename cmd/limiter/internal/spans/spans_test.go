package spans

import (
	"testing"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/internal/tracing"
	"github.com/ratewarden/ratewarden/policy"
)

// With tracing off nothing is wired in: the values come back untouched.
func TestOffIsUntouched(t *testing.T) {
	tr, err := tracing.New(func(string) string { return "" }, "limiter")
	if err != nil {
		t.Fatal(err)
	}
	auth := enforcement.NewMemoryAuthority(nil, 1000)
	if got := Authority(tr, auth, "memory"); got != enforcement.Authority(auth) {
		t.Errorf("Authority with tracing off: %T, want the authority itself", got)
	}
	pol, err := policy.Parse([]byte("version: 1\ndefault_tier: t\ntiers:\n  t: { rate: 1, burst: 1 }\n"))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := enforcement.New(enforcement.Config{Authority: auth, Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	if got := Check(tr, lim); got != Checker(lim) {
		t.Errorf("Check with tracing off: %T, want the limiter itself", got)
	}
	if opts := GRPC(tr); opts != nil {
		t.Errorf("GRPC with tracing off: %d options, want none", len(opts))
	}
}
