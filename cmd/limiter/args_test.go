package main

import (
	"fmt"
	"testing"

	"github.com/ratewarden/ratewarden/testkit/clitest"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestStrictWords: the binary refuses every word it does not know (usage on
// stderr, exit 2) without listening on either of its ports, and answers
// help on stdout with exit 0, at the top and for every policy verb. The
// environment is one the limiter serves with (the control case proves it),
// so a word ignored would show as a listening port.
func TestStrictWords(t *testing.T) {
	t.Parallel()
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	grpcAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	env := []string{"LIMITER_ADDR=" + addr, "LIMITER_GRPC_ADDR=" + grpcAddr,
		"POLICY_FILE=../../deploy/policy.yaml", fmt.Sprintf("REDIS_ADDRS=127.0.0.1:%d", testenv.FreePort(t))}
	addrs := []string{addr, grpcAddr}
	refused := func(out string, args ...string) clitest.Case { return clitest.Case{Args: args, Code: 2, Out: out} }
	help := func(out string, args ...string) clitest.Case { return clitest.Case{Args: args, Code: 0, Out: out} }
	clitest.RunCases(t, limiterBin, env, addrs, []clitest.Case{
		refused(`unknown command "overide"`, "overide", "set", "x"),
		refused("--reason is required", "override", "set", "x"),
		refused("flag provided but not defined: -bogus", "override", "list", "--bogus"),
		refused("flag provided but not defined: -bogus", "policy", "push", "--bogus"),
		refused("fleet status takes no arguments", "fleet", "status", "x"),
		refused(`unknown command "state"`, "fleet", "state"),
		refused(`unknown flag "--polcy"`, "--polcy", "x"),
		refused(`unknown command "frobnicate"`, "frobnicate"),
		refused(`unknown flag "-x"`, "-x"),
		refused(`unknown command "bogus"`, "policy", "bogus"),
		refused("limiter policy: a command is required", "policy"),
		refused("flag provided but not defined: -bogus", "policy", "check", "--bogus"),
		refused("flag provided but not defined: -bogus", "policy", "explain", "../../deploy/policy.yaml", "--bogus"),
		refused("flag provided but not defined: -bogus", "policy", "replay", "--bogus"),
		refused("one policy FILE is required", "policy", "check"),
		refused(`no help for "frobnicate"`, "help", "frobnicate"),
		help("usage: limiter\n", "--help"),
		help("limiter policy replay [FILE]", "-h"),
		help("limiter policy explain FILE", "help"),
		help("usage: limiter policy COMMAND", "policy", "--help"),
		help("usage: limiter policy COMMAND", "help", "policy"),
		help("usage: limiter policy check FILE", "policy", "check", "--help"),
		help("usage: limiter policy explain FILE", "policy", "explain", "-h"),
		help("-descriptor value", "help", "policy", "explain"),
		help("usage: limiter policy replay [FILE]", "policy", "replay", "--help"),
		help("limiter policy push FILE -m MESSAGE", "policy", "push", "--help"),
		help("limiter override set KEY", "override", "set", "-h"),
		help("limiter fleet status", "fleet", "status", "--help"),
		help("usage: limiter override COMMAND", "override", "--help"),
	})
	if !clitest.Serves(t, limiterBin, env, addr) {
		t.Fatalf("the control failed: with no words the limiter did not listen on %s, so the cases above prove nothing", addr)
	}
}
