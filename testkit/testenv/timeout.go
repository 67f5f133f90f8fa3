package testenv

import (
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"
)

// ScaleVar names the one knob for every deadline of the tests: a positive
// number (default 1) that Timeout multiplies them by. A machine slower or
// busier than the suite's design (a CI runner shared with other jobs, a
// laptop on battery) raises it, say to 3, instead of each test guessing its
// own margin. It scales only how long a test waits for something to
// happen, never what the test asserts.
const ScaleVar = "RATEWARDEN_TEST_TIMEOUT_SCALE"

var scale = sync.OnceValues(func() (float64, error) { return parseScale(os.Getenv(ScaleVar)) })

// parseScale reads the scale's value: empty is 1; else a number above 0
// and at most 1000 (a larger one is a typo, not a machine).
func parseScale(s string) (float64, error) {
	if s == "" {
		return 1, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || !(f > 0 && f <= 1000) {
		return 1, fmt.Errorf("%s=%q: want a positive number (1 is the default)", ScaleVar, s)
	}
	return f, nil
}

// Timeout is d scaled by RATEWARDEN_TEST_TIMEOUT_SCALE: the deadline for a
// test's wait that takes d on the machine the suite was written for. A
// malformed scale panics (a test run with a knob it ignored would mislead).
// Safe for concurrent use.
func Timeout(d time.Duration) time.Duration {
	f, err := scale()
	if err != nil {
		panic(err)
	}
	return time.Duration(float64(d) * f)
}

// WaitFor polls cond every 20 ms until it holds and fails tb (Fatal) if it
// does not within Timeout(within). A test waits for the event it needs this
// way (a row in ClickHouse, a metric reaching a value, a process ready),
// never by sleeping a fixed time and then asserting. It returns how long
// the wait took. cond runs on the calling goroutine.
func WaitFor(tb testing.TB, within time.Duration, what string, cond func() bool) time.Duration {
	tb.Helper()
	start := time.Now()
	if err := Poll(within, cond); err != nil {
		tb.Fatalf("%s: %v", what, err)
	}
	return time.Since(start)
}

// Poll is WaitFor without a test: it polls cond every 20 ms and returns
// nil once it holds, or an error naming the deadline (Timeout(within)).
// For goroutines other than the test's, which must not call Fatal.
func Poll(within time.Duration, cond func() bool) error {
	within = Timeout(within)
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %v (%s=%s)", within, ScaleVar, scaleText())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

func scaleText() string {
	f, _ := scale()
	return strconv.FormatFloat(f, 'g', -1, 64)
}
