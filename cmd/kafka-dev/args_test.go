package main

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/ratewarden/ratewarden/testkit/clitest"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestStrictWords: the real binary takes no words: any is refused with
// usage on stderr and exit 2 before it listens; help is on stdout, exit 0.
func TestStrictWords(t *testing.T) {
	testenv.SkipShort(t) // builds and runs the binary
	bin := filepath.Join(t.TempDir(), "kafka-dev")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	env := []string{"KAFKA_DEV_ADDR=" + addr}
	clitest.RunCases(t, bin, env, []string{addr}, []clitest.Case{
		{Args: []string{"--partitions", "8"}, Code: 2, Out: `kafka-dev: unknown flag "--partitions"`},
		{Args: []string{"start"}, Code: 2, Out: "usage: kafka-dev\n"},
		{Args: []string{"--help"}, Code: 0, Out: "usage: kafka-dev\n"},
		{Args: []string{"help"}, Code: 0, Out: "KAFKA_DEV_ADDR"},
	})
	if !clitest.Serves(t, bin, env, addr) {
		t.Fatalf("the control failed: with no words kafka-dev did not listen on %s", addr)
	}
}
