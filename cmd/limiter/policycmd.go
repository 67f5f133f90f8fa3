package main

import (
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/ratewarden/ratewarden/policy"
)

const policyUsage = `usage:
  limiter policy check FILE
  limiter policy explain FILE --key K --scope S [--tier T]
  limiter policy explain FILE --domain D --descriptor KEY=VALUE [--descriptor KEY=VALUE ...]
  limiter policy replay FILE (--from T --to T | --since D) [--sample F] [--top N] [--json]`

// policyCommand runs `limiter policy ...` and returns the exit code.
func policyCommand(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && isPolicyLogVerb(args[0]) { // the policy log's verbs (policylog_cmd.go)
		return policyLogCommand(args, stdout, stderr)
	}
	if len(args) < 2 {
		fmt.Fprintln(stderr, policyUsage)
		return 2
	}
	verb := args[0]
	if verb == "replay" { // what the file would have done to recorded traffic (replay.go)
		return replayCommand(args[1:], stdout, stderr)
	}
	if verb != "check" && verb != "explain" {
		fmt.Fprintln(stderr, policyUsage)
		return 2
	}
	fs := flag.NewFlagSet(verb, flag.ContinueOnError)
	fs.SetOutput(stderr)
	key := fs.String("key", "", "rate-limit key")
	scope := fs.String("scope", "", "scope")
	tier := fs.String("tier", "", "tier (default: the keys map, else default_tier)")
	domain := fs.String("domain", "", "Envoy rate limit domain (with --descriptor)")
	var entries descriptorFlag
	fs.Var(&entries, "descriptor", "an entry KEY=VALUE of an Envoy descriptor, in order (repeat for each entry)")
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
	if verb == "check" && (*key != "" || *scope != "" || *tier != "" || *domain != "" || len(entries) > 0) {
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
		printDomains(stdout, p)
		return 0
	case "explain":
		if *domain != "" || len(entries) > 0 {
			if *domain == "" || len(entries) == 0 || *key != "" || *scope != "" || *tier != "" {
				fmt.Fprintln(stderr, "explain takes either --domain with --descriptor, or --key and --scope\n"+policyUsage)
				return 2
			}
			fmt.Fprint(stdout, policy.ExplainDescriptor(p, *domain, entries))
			return 0
		}
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

// descriptorFlag collects --descriptor KEY=VALUE entries, in order.
type descriptorFlag []policy.Entry

func (d *descriptorFlag) String() string { return fmt.Sprint(*d) }

func (d *descriptorFlag) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("want KEY=VALUE, got %q", v)
	}
	*d = append(*d, policy.Entry{Key: k, Value: val})
	return nil
}

// printDomains lists the Envoy domains of p and their descriptor mappings.
func printDomains(w io.Writer, p *policy.Policy) {
	names := p.Domains()
	sort.Strings(names)
	for _, name := range names {
		fmt.Fprintf(w, "domain %s:\n", name)
		for i, m := range p.File().Domains[name].Descriptors {
			label := m.Name
			if label == "" {
				label = fmt.Sprintf("descriptors[%d]", i)
			}
			tier := ""
			if m.Tier != "" {
				tier = " tier " + m.Tier
			}
			fmt.Fprintf(w, "  %-20s [%s] -> key %q scope %q%s\n", label, strings.Join(m.Match, ", "), m.Key, m.Scope, tier)
		}
	}
}
