package httpapi_test

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/httpapi"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestCheckShedOnARate: /check on a rate alone (burst 4, refilling one
// token in 1,000 s) with priorities: the sheddable class (share 0.5) is
// allowed twice, then answered "reason": "shed" with a retry time while
// tokens are left; critical spends the last two; then every class is
// refused for the rate, with no reason.
func TestCheckShedOnARate(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	pol, err := policy.Parse([]byte("version: 1\ndefault_tier: t\npriorities: { critical: 1, default: 1, sheddable: 0.5 }\ntiers:\n  t: { rate: 0.001, burst: 4 }\n"))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := enforcement.New(enforcement.Config{Authority: redisstore.New(rdb, "rc"), Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	check := httpapi.NewCheckHandler(lim, "", nil)
	sheddable := `{"key":"acct","scope":"api","priority":"sheddable"}`
	critical := `{"key":"acct","scope":"api","priority":"critical"}`
	for i := range 2 {
		if code, d := postJSON(t, check, sheddable); code != 200 || d["allowed"] != true {
			t.Fatalf("sheddable %d within its share: %d %v", i+1, code, d)
		}
	}
	code, d := postJSON(t, check, sheddable)
	if code != 200 || d["allowed"] != false || d["reason"] != "shed" || d["remaining"].(float64) != 2 || d["retryAfterMs"].(float64) <= 0 {
		t.Fatalf("sheddable at its floor: %d %v; want shed with 2 left and a retry time", code, d)
	}
	for i := range 2 {
		if code, d := postJSON(t, check, critical); code != 200 || d["allowed"] != true {
			t.Fatalf("critical %d below the floor: %d %v", i+1, code, d)
		}
	}
	for _, body := range []string{critical, sheddable} {
		if code, d := postJSON(t, check, body); code != 200 || d["allowed"] != false || d["reason"] != nil {
			t.Fatalf("%s on the empty bucket: %d %v; want refused for the rate, no reason", body, code, d)
		}
	}
	if code, d := postJSON(t, check, `{"key":"acct","scope":"api","priority":"bulk"}`); code != 400 {
		t.Fatalf("undefined class: %d %v", code, d)
	}
}
