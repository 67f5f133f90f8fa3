package proccpu_test

import (
	"os"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/proccpu"
)

// Both readings of this process agree and grow with work: Of counts in
// ticks of 10 ms, so they may differ by a tick (and a little more for the
// time between the two reads).
func TestSelfAndOfAgree(t *testing.T) {
	start := proccpu.Self()
	for x := 0; proccpu.Self()-start < 50*time.Millisecond; x++ {
		_ = x * x
	}
	self := proccpu.Self()
	of, err := proccpu.Of(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if self < 50*time.Millisecond {
		t.Fatalf("Self %v after 50 ms of work", self)
	}
	if d := self - of; d < -20*time.Millisecond || d > 20*time.Millisecond {
		t.Errorf("Self %v, Of(own pid) %v: more than two ticks apart", self, of)
	}
	if _, err := proccpu.Of(1 << 30); err == nil {
		t.Error("Of of a pid that does not exist gave no error")
	}
}
