package policyctl

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/ratewarden/ratewarden/internal/cli"
	"github.com/ratewarden/ratewarden/internal/redisclient"
	"github.com/ratewarden/ratewarden/limits"
	"github.com/ratewarden/ratewarden/policy"
)

const (
	checkUsage = `usage: limiter policy check FILE
  Validates the policy FILE as the limiter loads it; prints its version,
  tiers, rules, warnings and Envoy domain mappings. Exit 1 when refused.`
	explainUsage = `usage: limiter policy explain FILE --key K --scope S [--tier T]
       limiter policy explain FILE --domain D --descriptor KEY=VALUE [--descriptor KEY=VALUE ...]
  Shows which rules match a key and scope (or what an Envoy descriptor maps
  to) under the policy FILE, which one wins, and the limit that results.`
)

// policyCheck runs `limiter policy check`.
func policyCheck(args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("limiter policy check")
	files, err := cli.Parse(fs, args)
	if err != nil {
		return cli.FlagExit(err, fs, checkUsage, stdout, stderr)
	}
	if len(files) != 1 {
		return cli.Refuse("one policy FILE is required", fs, checkUsage, stderr)
	}
	file := files[0]
	// The stores it routes keys to must be this environment's (REDIS_STORES).
	known, err := redisclient.StoresOfEnv(os.Getenv, limits.ValidStoreName)
	if err != nil {
		return invalidConfig("limiter policy check", err, stderr)
	}
	p, ok := readPolicyFile(file, stderr)
	if !ok {
		return cli.ExitFail
	}
	if err := p.CheckStores(func(name string) bool { return known[name] != nil }); err != nil {
		fmt.Fprintln(stderr, "policy refused:")
		fmt.Fprintln(stderr, "  "+err.Error())
		return cli.ExitFail
	}
	fmt.Fprintf(stdout, "ok: %s is valid (version %d, %d tiers, %d rules, sha256 %s)\n",
		file, p.Version(), len(p.File().Tiers), len(p.File().Rules), p.Hash())
	for _, w := range p.Warnings() {
		fmt.Fprintln(stdout, "warning: "+w)
	}
	printDomains(stdout, p)
	return cli.ExitOK
}

// policyExplain runs `limiter policy explain`.
func policyExplain(args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("limiter policy explain")
	key := fs.String("key", "", "rate-limit key")
	scope := fs.String("scope", "", "scope")
	tier := fs.String("tier", "", "tier (default: the keys map, else default_tier)")
	domain := fs.String("domain", "", "Envoy rate limit domain (with --descriptor)")
	var entries descriptorFlag
	fs.Var(&entries, "descriptor", "an entry KEY=VALUE of an Envoy descriptor, in order (repeat for each entry)")
	files, err := cli.Parse(fs, args)
	if err != nil {
		return cli.FlagExit(err, fs, explainUsage, stdout, stderr)
	}
	if len(files) != 1 {
		return cli.Refuse("one policy FILE is required", fs, explainUsage, stderr)
	}
	byDescriptor := *domain != "" || len(entries) > 0
	switch {
	case byDescriptor && (*domain == "" || len(entries) == 0 || *key != "" || *scope != "" || *tier != ""):
		return cli.Refuse("explain takes either --domain with --descriptor, or --key and --scope", fs, explainUsage, stderr)
	case !byDescriptor && (*key == "" || *scope == ""):
		return cli.Refuse("explain needs --key and --scope", fs, explainUsage, stderr)
	}
	// A REDIS_STORES the limiter would refuse is this environment's mistake
	// whatever the policy says.
	if _, err := redisclient.StoresOfEnv(os.Getenv, limits.ValidStoreName); err != nil {
		return invalidConfig("limiter policy explain", err, stderr)
	}
	p, ok := readPolicyFile(files[0], stderr)
	if !ok {
		return cli.ExitFail
	}
	if byDescriptor {
		fmt.Fprint(stdout, policy.ExplainDescriptor(p, *domain, entries))
		return cli.ExitOK
	}
	if _, err := p.Resolve(*key, *scope, *tier); err != nil {
		fmt.Fprintf(stderr, "cannot resolve: %v\n", err)
		return cli.ExitFail
	}
	fmt.Fprint(stdout, policy.Explain(p, *key, *scope, *tier))
	return cli.ExitOK
}

// invalidConfig reports configuration errors (one line, each naming its
// variable, as the limiter's start does) and is exit 2: nothing ran.
func invalidConfig(cmd string, err error, stderr io.Writer) int {
	fmt.Fprintln(stderr, cmd+": invalid configuration: "+err.Error())
	return cli.ExitUsage
}

// readPolicyFile loads file, or prints why it is refused, one problem a line.
func readPolicyFile(file string, stderr io.Writer) (*policy.Policy, bool) {
	p, err := policy.Load(file)
	if err != nil {
		fmt.Fprintln(stderr, "policy refused:")
		for _, line := range strings.Split(err.Error(), "\n") {
			fmt.Fprintln(stderr, "  "+line)
		}
		return nil, false
	}
	return p, true
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
