package main

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/ratewarden/ratewarden/testkit/clitest"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestStrictWords: the real binary takes no words: any is refused with
// usage on stderr and exit 2 before it sends anything; help is on stdout,
// exit 0.
func TestStrictWords(t *testing.T) {
	testenv.SkipShort(t) // builds and runs the binary
	bin := filepath.Join(t.TempDir(), "demo-traffic")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	// A URL nothing serves: a binary that ignored its words would run
	// until killed, which Run reports as a failure.
	env := []string{"DEMO_LIMITER_URL=http://127.0.0.1:9"}
	clitest.RunCases(t, bin, env, nil, []clitest.Case{
		{Args: []string{"--rps", "10"}, Code: 2, Out: `demo-traffic: unknown flag "--rps"`},
		{Args: []string{"run"}, Code: 2, Out: "usage: demo-traffic\n"},
		{Args: []string{"-h"}, Code: 0, Out: "DEMO_RPS"},
		{Args: []string{"help"}, Code: 0, Out: "usage: demo-traffic\n"},
	})
}
