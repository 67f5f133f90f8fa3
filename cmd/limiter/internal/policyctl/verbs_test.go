package policyctl

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestLineDiff(t *testing.T) {
	got := lineDiff("a\nb\nc\n", "a\nc\nd\n")
	if want := " a\n-b\n c\n+d\n"; got != want {
		t.Errorf("lineDiff = %q, want %q", got, want)
	}
	if got := lineDiff("same\n", "same\n"); got != " same\n" {
		t.Errorf("identical documents: %q", got)
	}
}

func TestParseExpiry(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 0, 500, time.UTC)
	if got, err := parseExpiry("72h", now); err != nil || !got.Equal(time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)) {
		t.Errorf("72h: %v, %v", got, err)
	}
	if got, err := parseExpiry("2026-12-24T00:00:00+01:00", now); err != nil || !got.Equal(time.Date(2026, 12, 23, 23, 0, 0, 0, time.UTC)) {
		t.Errorf("an instant: %v, %v", got, err)
	}
	for _, bad := range []string{"", "-1h", "tomorrow"} {
		if _, err := parseExpiry(bad, now); err == nil {
			t.Errorf("parseExpiry(%q) accepted", bad)
		}
	}
}

// The writer checks the stores a write routes keys to against its own
// REDIS_STORES: unset, it warns; set, a name it lacks refuses the write.
func TestCheckWriterStores(t *testing.T) {
	names := map[string]string{"acme": "tiers.dedicated.store"}
	var errOut strings.Builder
	if !checkWriterStores(names, func(string) string { return "" }, &errOut) || !strings.Contains(errOut.String(), "warning:") {
		t.Errorf("REDIS_STORES unset: want a warning and the write allowed, got %q", errOut.String())
	}
	env := func(v string) func(string) string {
		return func(k string) string { return map[string]string{"REDIS_STORES": v}[k] }
	}
	errOut.Reset()
	if checkWriterStores(names, env("other=r:6379"), &errOut) || !strings.Contains(errOut.String(), `store "acme"`) {
		t.Errorf("a store REDIS_STORES lacks: want refused naming it, got %q", errOut.String())
	}
	errOut.Reset()
	if !checkWriterStores(names, env("acme=r:6379"), &errOut) || errOut.Len() != 0 {
		t.Errorf("a known store: want allowed in silence, got %q", errOut.String())
	}
	errOut.Reset()
	if checkWriterStores(names, env("acme"), &errOut) || !strings.Contains(errOut.String(), "invalid configuration") {
		t.Errorf("a malformed REDIS_STORES: want refused, got %q", errOut.String())
	}
}

func TestParseReplayArgs(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	env := func(string) string { return "" }
	a, _, err := parseReplayArgs([]string{"cand.yaml", "--since", "1h", "--sample", "0.5"}, env, now)
	if err != nil || a.file != "cand.yaml" || !a.from.Equal(now.Add(-time.Hour)) || !a.to.Equal(now) || a.sample != 0.5 {
		t.Errorf("--since: %+v, %v", a, err)
	}
	for _, args := range [][]string{
		{"--since", "1h", "--from", "2026-12-01T09:00:00Z"},
		{"a.yaml", "b.yaml", "--since", "1h"},
		{"--from", "2026-12-01T09:00:00Z"},
		{"--since", "1h", "--sample", "0"},
	} {
		if _, _, err := parseReplayArgs(args, env, now); err == nil {
			t.Errorf("%v accepted", args)
		} else if _, ok := err.(errReplayArgs); !ok {
			t.Errorf("%v: %v is not a problem of the words (exit 2 with usage)", args, err)
		}
	}
}

// The verbs refuse their words before they read the environment's
// connections: each case returns before Kafka, with the usage (exit 2),
// or with a refusal of the file or store (exit 1).
func TestVerbArgs(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(good, []byte("version: 1\ndefault_tier: std\ntiers:\n  std: { rate: 10, burst: 10 }\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("version: 1\ndefault_tier: nowhere\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KAFKA_BROKERS", "") // a case that got as far as Kafka would fail its stderr check
	t.Setenv("REDIS_STORES", "other=r:6379")
	t.Setenv("POLICY_SIGNING_KEY_FILE", "")
	type verb func(args []string, stdout, stderr io.Writer) int
	for _, c := range []struct {
		name   string
		verb   verb
		args   []string
		code   int
		stderr string // a line it must print
	}{
		{"push without a file", Push, nil, 2, policyLogUsage},
		{"push of two files", Push, []string{good, bad, "-m", "m"}, 2, policyLogUsage},
		{"push without -m", Push, []string{good}, 2, "-m MESSAGE is required"},
		{"push with an unknown flag", Push, []string{good, "-m", "m", "--limit", "3"}, 2, "flag provided but not defined: -limit"},
		{"push with a bad replay window", Push, []string{good, "-m", "m", "--replay-window", "0s"}, 2, "--replay-window must be positive"},
		{"push of a missing file", Push, []string{filepath.Join(dir, "none.yaml"), "-m", "m"}, 1, "no such file"},
		{"push of an invalid document", Push, []string{bad, "-m", "m"}, 1, "refused (invalid):"},
		{"rollout without its bound", Push, []string{good, "-m", "m", "--shadow-for", "1h"}, 2, "a rollout needs"},
		{"rollout without its span", Push, []string{good, "-m", "m", "--max-newly-rejected", "1%"}, 2, "a rollout needs"},
		{"rollout beyond its longest span", Push, []string{good, "-m", "m", "--shadow-for", "200h", "--max-newly-rejected", "1%"}, 2, "a rollout needs"},
		{"rollout with a bad share", Push, []string{good, "-m", "m", "--shadow-for", "1h", "--max-newly-rejected", "x"}, 2, "a rollout needs"},
		{"rollback without a revision", Rollback, []string{"-m", "m"}, 2, policyLogUsage},
		{"rollback without -m", Rollback, []string{"3"}, 2, "-m MESSAGE is required"},
		{"rollback to x", Rollback, []string{"x", "-m", "m"}, 2, `"x" is not a revision`},
		{"rollback to 0", Rollback, []string{"0", "-m", "m"}, 2, `"0" is not a revision`},
		{"rollback with push's flag", Rollback, []string{"3", "-m", "m", "--expect-revision", "2"}, 2, "flag provided but not defined"},
		{"history with a word", History, []string{"3"}, 2, policyLogUsage},
		{"history with a bad limit", History, []string{"--limit", "x"}, 2, "invalid value"},
		{"show of two revisions", Show, []string{"1", "2"}, 2, policyLogUsage},
		{"show of x", Show, []string{"x"}, 2, `"x" is not a revision`},
		{"show with --json", Show, []string{"--json"}, 2, "flag provided but not defined"},
		{"diff of one revision", Diff, []string{"1"}, 2, policyLogUsage},
		{"diff with x", Diff, []string{"1", "x"}, 2, `"x" is not a revision`},
		{"override set without a key", OverrideSet, []string{"--tier", "pro", "--reason", "r"}, 2, overrideUsage},
		{"override set without --reason", OverrideSet, []string{"k", "--tier", "pro"}, 2, "--reason is required"},
		{"override set with a bad --expires", OverrideSet, []string{"k", "--tier", "pro", "--reason", "r", "--expires", "tomorrow"}, 2, `--expires "tomorrow"`},
		{"override set to an unknown store", OverrideSet, []string{"k", "--tier", "pro", "--reason", "r", "--store", "acme"}, 1, `store "acme"`},
		{"override get without a key", OverrideGet, nil, 2, overrideUsage},
		{"override get with --reason", OverrideGet, []string{"k", "--reason", "r"}, 2, "flag provided but not defined"},
		{"override list with a word", OverrideList, []string{"k"}, 2, overrideUsage},
		{"override list with --scope", OverrideList, []string{"--scope", "s"}, 2, "flag provided but not defined"},
		{"override delete without --reason", OverrideDelete, []string{"k"}, 2, "--reason is required"},
		{"override delete of two keys", OverrideDelete, []string{"k", "l", "--reason", "r"}, 2, overrideUsage},
	} {
		var stdout, stderr strings.Builder
		if code := c.verb(c.args, &stdout, &stderr); code != c.code || !strings.Contains(stderr.String(), c.stderr) {
			t.Errorf("%s: exit %d, stderr %q; want exit %d and %q", c.name, code, stderr.String(), c.code, c.stderr)
		}
		if stdout.Len() != 0 {
			t.Errorf("%s: stdout %q, want nothing", c.name, stdout.String())
		}
	}
}

// -h prints a verb's usage and flags on stdout, and exits 0.
func TestVerbHelp(t *testing.T) {
	for name, v := range map[string]func([]string, io.Writer, io.Writer) int{
		"push": Push, "rollback": Rollback, "history": History, "show": Show, "diff": Diff,
		"override set": OverrideSet, "override get": OverrideGet, "override list": OverrideList, "override delete": OverrideDelete,
	} {
		var stdout, stderr strings.Builder
		if code := v([]string{"-h"}, &stdout, &stderr); code != 0 || !strings.HasPrefix(stdout.String(), "usage:") || stderr.Len() != 0 {
			t.Errorf("%s -h: exit %d, stdout %q, stderr %q", name, code, stdout.String(), stderr.String())
		}
	}
}
