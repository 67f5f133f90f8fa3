package notify_test

import (
	"fmt"
	"net/http"
	"time"

	"github.com/ratewarden/ratewarden/metering/notify"
)

// A receiver checks a soft-limit webhook with the endpoint's secret.
func ExampleVerify() {
	key, err := notify.ParseSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		panic(err)
	}
	body := []byte(`{"type":"ratelimit.soft_limit.crossed"}`)
	sent := time.Unix(1700000000, 0)
	h := http.Header{}
	notify.SetHeaders(h, key, "msg_01", sent, body) // what the notifier does (signature checked with Python's hmac)

	fmt.Println(h.Get("webhook-signature"))
	fmt.Println(notify.Verify(key, h, body, sent.Add(30*time.Second), 5*time.Minute))
	fmt.Println(notify.Verify(key, h, []byte(`{"type":"forged"}`), sent, 5*time.Minute))
	// Output:
	// v1,EhTHu2n5eJVm8Gx8q2FdoR0AQ3J2fHb8Hc9xmQfcgG0=
	// <nil>
	// webhook: no matching signature
}

// The wait after each failed attempt of the default schedule, without and
// with full jitter.
func ExampleSchedule_Wait() {
	s := notify.DefaultSchedule()
	for n := 1; n < s.Attempts; n++ {
		fmt.Printf("after attempt %d: %s to %s\n", n, s.Wait(n, 0), s.Wait(n, 1))
	}
	// Output:
	// after attempt 1: 1s to 2s
	// after attempt 2: 2s to 4s
	// after attempt 3: 4s to 8s
	// after attempt 4: 8s to 16s
	// after attempt 5: 16s to 32s
	// after attempt 6: 32s to 1m4s
	// after attempt 7: 1m4s to 2m8s
}
