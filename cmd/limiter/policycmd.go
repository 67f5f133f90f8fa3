package main

import (
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/ratewarden/ratewarden/policy"
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
	verb := args[0]
	if verb != "check" && verb != "explain" {
		fmt.Fprintln(stderr, policyUsage)
		return 2
	}
	fs := flag.NewFlagSet(verb, flag.ContinueOnError)
	fs.SetOutput(stderr)
	key := fs.String("key", "", "rate-limit key")
	scope := fs.String("scope", "", "scope")
	tier := fs.String("tier", "", "tier (default: the keys map, else default_tier)")
	// FILE may come before or after the flags.
	rest := args[1:]
	var files []string
	for len(rest) > 0 {
		if err := fs.Parse(rest); err != nil {
			return 2
		}
		if fs.NArg() == 0 {
			break
		}
		files = append(files, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	if len(files) != 1 {
		fmt.Fprintln(stderr, "one policy FILE is required\n"+policyUsage)
		return 2
	}
	if verb == "check" && (*key != "" || *scope != "" || *tier != "") {
		fmt.Fprintln(stderr, "check takes no flags\n"+policyUsage)
		return 2
	}
	file := files[0]
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
		for _, w := range p.Warnings() {
			fmt.Fprintln(stdout, "warning: "+w)
		}
		return 0
	case "explain":
		if *key == "" || *scope == "" {
			fmt.Fprintln(stderr, "explain needs --key and --scope\n"+policyUsage)
			return 2
		}
		if _, err := p.Resolve(*key, *scope, *tier); err != nil {
			fmt.Fprintf(stderr, "cannot resolve: %v\n", err)
			return 1
		}
		fmt.Fprint(stdout, policy.Explain(p, *key, *scope, *tier))
		return 0
	}
	fmt.Fprintln(stderr, policyUsage)
	return 2
}
