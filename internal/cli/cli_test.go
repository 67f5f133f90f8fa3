package cli

import (
	"fmt"
	"io"
	"strings"
	"testing"
)

// testProgram has the shape the limiter grows into: groups of verbs, one
// of which parses flags and a FILE, beside a default action.
func testProgram(served *int) Program {
	echo := func(name string) func([]string, io.Writer, io.Writer) int {
		return func(args []string, stdout, stderr io.Writer) int {
			fs := NewFlagSet("tool " + name)
			json := fs.Bool("json", false, "JSON output")
			files, err := Parse(fs, args)
			if err != nil {
				return FlagExit(err, fs, "usage: tool "+name+" FILE [--json]", stdout, stderr)
			}
			if len(files) != 1 {
				return Refuse("one FILE is required", fs, "usage: tool "+name+" FILE [--json]", stderr)
			}
			fmt.Fprintf(stdout, "%s %s json=%v\n", name, files[0], *json)
			return ExitOK
		}
	}
	return Program{
		Name: "tool",
		Doc:  "With no arguments the tool serves.",
		Commands: []Command{
			{Name: "policy", Sub: []Command{
				{Name: "check", Args: "FILE", Summary: "validate a file", Run: echo("policy check")},
				{Name: "push", Args: "FILE", Summary: "push a file", Run: echo("policy push")},
			}},
			{Name: "override", Sub: []Command{
				{Name: "set", Args: "FILE", Summary: "set an override", Run: echo("override set")},
			}},
			{Name: "version", Summary: "print the version", Run: func(args []string, stdout, stderr io.Writer) int {
				fmt.Fprintln(stdout, "v1")
				return ExitOK
			}},
		},
		Serve: func() int { *served++; return 7 },
	}
}

func TestProgram(t *testing.T) {
	for _, c := range []struct {
		args   []string
		code   int
		stdout string // substring (stderr then empty) when code is 0
		stderr string // substring (stdout then empty) otherwise
	}{
		{[]string{"--help"}, 0, "usage: tool\n       tool COMMAND [ARGS]", ""},
		{[]string{"-h"}, 0, "  tool override set FILE\n      set an override\n", ""},
		{[]string{"help"}, 0, "With no arguments the tool serves.", ""},
		{[]string{"help", "policy"}, 0, "usage: tool policy COMMAND [ARGS]", ""},
		{[]string{"policy", "-h"}, 0, "  tool policy push FILE\n      push a file\n", ""},
		{[]string{"help", "policy", "push"}, 0, "usage: tool policy push FILE [--json]\n\nflags:\n  -json", ""},
		{[]string{"policy", "push", "--help"}, 0, "usage: tool policy push FILE [--json]", ""},
		{[]string{"policy", "push", "a.yaml", "--json"}, 0, "policy push a.yaml json=true", ""},
		{[]string{"policy", "push", "--json", "--", "-a.yaml"}, 0, "policy push -a.yaml json=true", ""},
		{[]string{"version"}, 0, "v1", ""},
		{[]string{"frobnicate"}, 2, "", "tool: unknown command \"frobnicate\"\n\nusage: tool\n"},
		{[]string{"--polcy", "x"}, 2, "", "tool: unknown flag \"--polcy\""},
		{[]string{"policy"}, 2, "", "tool policy: a command is required\n\nusage: tool policy COMMAND"},
		{[]string{"policy", "bogus"}, 2, "", "tool policy: unknown command \"bogus\""},
		{[]string{"override", "set", "--bogus"}, 2, "", "tool override set: flag provided but not defined: -bogus"},
		{[]string{"override", "set"}, 2, "", "tool override set: one FILE is required"},
		{[]string{"help", "override", "get"}, 2, "", "tool: no help for \"override get\""},
		{[]string{"help", "version", "x"}, 2, "", "no help for"},
	} {
		var stdout, stderr strings.Builder
		served := 0
		code := testProgram(&served).Main(c.args, &stdout, &stderr)
		want, wantOther, got, other := c.stdout, "stderr", stdout.String(), stderr.String()
		if c.code != 0 {
			want, wantOther, got, other = c.stderr, "stdout", stderr.String(), stdout.String()
		}
		if code != c.code || !strings.Contains(got, want) || other != "" || served != 0 {
			t.Errorf("%q: exit %d (want %d), served %d; want %q, and %s empty\nstdout: %s\nstderr: %s",
				c.args, code, c.code, served, want, wantOther, stdout.String(), stderr.String())
		}
	}
	served := 0
	if code := testProgram(&served).Main(nil, io.Discard, io.Discard); code != 7 || served != 1 {
		t.Errorf("no words: exit %d, served %d; want Serve's 7, once", code, served)
	}
}

// TestUsageFromTheTable: every verb of the table, and nothing else, is in
// the usage, in table order.
func TestUsageFromTheTable(t *testing.T) {
	var b strings.Builder
	testProgram(new(int)).Usage(&b)
	var lines []string
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(l, "  tool ") {
			lines = append(lines, l)
		}
	}
	want := []string{"  tool policy check FILE", "  tool policy push FILE", "  tool override set FILE", "  tool version"}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("usage lists\n%s\nwant\n%s\n(whole usage:\n%s)", strings.Join(lines, "\n"), strings.Join(want, "\n"), b.String())
	}
}
