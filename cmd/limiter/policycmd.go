package main

import (
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/ratewarden/ratewarden/enforcement/policy"
)

const policyUsage = `usage:
  limiter policy check FILE
  limiter policy explain FILE --key K --scope S [--tier T]`

// policyCommand runs `limiter policy ...` and returns the exit code.
func policyCommand(args []string, stdout, stderr io.Writer) int {
	if len(args) < 2 {
		fmt.Fprintln(stderr, policyUsage)
		return 2
	}
	verb, file := args[0], args[1]
	p, err := policy.Load(file)
	if err != nil {
		fmt.Fprintln(stderr, "policy refused:")
		for _, line := range strings.Split(err.Error(), "\n") {
			fmt.Fprintln(stderr, "  "+line)
		}
		return 1
	}
	switch verb {
	case "check":
		fmt.Fprintf(stdout, "ok: %s is valid (version %d, %d tiers, %d rules, sha256 %s)\n",
			file, p.Version(), len(p.File().Tiers), len(p.File().Rules), p.Hash())
		return 0
	case "explain":
		fs := flag.NewFlagSet("explain", flag.ContinueOnError)
		fs.SetOutput(stderr)
		key := fs.String("key", "", "rate-limit key")
		scope := fs.String("scope", "", "scope")
		tier := fs.String("tier", "", "tier (default: the keys map, else default_tier)")
		if err := fs.Parse(args[2:]); err != nil {
			return 2
		}
		if *key == "" || *scope == "" {
			fmt.Fprintln(stderr, "explain needs --key and --scope\n"+policyUsage)
			return 2
		}
		fmt.Fprint(stdout, policy.Explain(p, *key, *scope, *tier))
		return 0
	}
	fmt.Fprintln(stderr, policyUsage)
	return 2
}
