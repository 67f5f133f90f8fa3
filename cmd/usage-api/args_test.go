package main

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/ratewarden/ratewarden/testkit/clitest"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestStrictWords: the real binary refuses every word (it takes none) with
// usage on stderr and exit 2, without listening on USAGE_API_ADDR, and
// answers help on stdout with exit 0. The environment is one it serves with
// (the control case proves it: it starts without ClickHouse), so a word
// ignored would show as a listening port.
func TestStrictWords(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(bins, "usage-api")
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	env := []string{"USAGE_API_ADDR=" + addr, fmt.Sprintf("CLICKHOUSE_ADDR=127.0.0.1:%d", testenv.FreePort(t)),
		"USAGE_ADMIN_TOKEN=args-admin-token-0123456789", "USAGE_TOKEN_SECRET=args-secret-0123456789abcdef"}
	clitest.RunCases(t, bin, env, []string{addr}, []clitest.Case{
		{Args: []string{"frobnicate"}, Code: 2, Out: `usage-api: unknown command "frobnicate"`},
		{Args: []string{"--addr", ":8081"}, Code: 2, Out: `unknown flag "--addr"`},
		{Args: []string{"policy", "check", "x"}, Code: 2, Out: "usage: usage-api\n"},
		{Args: []string{"--help"}, Code: 0, Out: "usage: usage-api\n"},
		{Args: []string{"-h"}, Code: 0, Out: "configuration is read from the environment"},
		{Args: []string{"help"}, Code: 0, Out: "usage: usage-api\n"},
	})
	if !clitest.Serves(t, bin, env, addr) {
		t.Fatalf("the control failed: with no words usage-api did not listen on %s, so the cases above prove nothing", addr)
	}
}
