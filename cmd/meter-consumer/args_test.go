package main

import (
	"fmt"
	"testing"

	"github.com/ratewarden/ratewarden/testkit/clitest"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestStrictWords: the real binary refuses every word (it takes none) with
// usage on stderr and exit 2, without listening on METER_ADDR, and answers
// help on stdout with exit 0. The environment is one it serves with (the
// control case proves it), so a word ignored would show as a listening
// port.
func TestStrictWords(t *testing.T) {
	t.Parallel()
	bin := testenv.Binary(t, "cmd/meter-consumer")
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	env := []string{"METER_ADDR=" + addr, fmt.Sprintf("KAFKA_BROKERS=127.0.0.1:%d", testenv.FreePort(t)),
		fmt.Sprintf("CLICKHOUSE_ADDR=127.0.0.1:%d", testenv.FreePort(t))}
	clitest.RunCases(t, bin, env, []string{addr}, []clitest.Case{
		{Args: []string{"frobnicate"}, Code: 2, Out: `meter-consumer: unknown command "frobnicate"`},
		{Args: []string{"--brokers", "x"}, Code: 2, Out: `unknown flag "--brokers"`},
		{Args: []string{"serve"}, Code: 2, Out: "usage: meter-consumer\n"},
		{Args: []string{"help", "x"}, Code: 2, Out: `no help for "x"`},
		{Args: []string{"--help"}, Code: 0, Out: "usage: meter-consumer\n"},
		{Args: []string{"-h"}, Code: 0, Out: "configuration is read from the environment"},
		{Args: []string{"help"}, Code: 0, Out: "usage: meter-consumer\n"},
	})
	if !clitest.Serves(t, bin, env, addr) {
		t.Fatalf("the control failed: with no words the consumer did not listen on %s, so the cases above prove nothing", addr)
	}
}
