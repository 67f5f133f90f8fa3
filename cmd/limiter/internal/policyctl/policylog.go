package policyctl

// The writers' verbs of the policy log (docs/policy-commands.md,
// docs/reference.md "CLI verbs"): `limiter policy push|rollback|history|show|diff`, `limiter
// override set|get|list|delete`, `limiter fleet status`. They reach Kafka
// with the limiter's variables (KAFKA_BROKERS, KAFKA_SASL_*, KAFKA_TLS*,
// POLICY_TOPIC). A write exits 0 only once it has read its own record back
// as applied; a refused write exits 1 with the reason; a usage error
// exits 2.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"strconv"
	"strings"
	"time"

	"github.com/ratewarden/ratewarden/internal/cli"
	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/internal/kafkaconn"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/policylog/kafkalog"
	"github.com/ratewarden/ratewarden/policylog/preview"
)

const policyLogUsage = `usage:
  limiter policy push FILE -m MESSAGE [--author A] [--expect-revision N] [--json]
      [--no-replay] [--replay-window 1h] [--replay-max-rows N] [--replay-timeout 20s]
  limiter policy push FILE --shadow-for D --max-newly-rejected P -m MESSAGE [--author A] [--json]
  limiter policy rollback REVISION -m MESSAGE [--author A] [--json]
  limiter policy history [--limit N] [--json]
  limiter policy show [REVISION]
  limiter policy diff REVISION_A REVISION_B`

// cliTimeout bounds one CLI command, reads and writes included.
const cliTimeout = 60 * time.Second

// cliFlags is a strict flag set (internal/cli): -h/--help prints the usage
// on stdout (exit 0), an unknown flag prints it on stderr (exit 2).
// Positional arguments may come before or after flags.
type cliFlags struct {
	*flag.FlagSet
	usage          string
	args           []string
	stdout, stderr io.Writer
	required       []requiredFlag
}

// requiredFlag is a string flag that must be given, and its name in the
// message that says so.
type requiredFlag struct {
	value *string
	name  string
}

func newCLIFlags(name, usage string, stdout, stderr io.Writer) *cliFlags {
	return &cliFlags{FlagSet: cli.NewFlagSet(name), usage: usage, stdout: stdout, stderr: stderr}
}

// parse reads args; when it returns false the command exits with code.
func (f *cliFlags) parse(args []string) (code int, ok bool) {
	rest, err := cli.Parse(f.FlagSet, args)
	if err != nil {
		return cli.FlagExit(err, f.FlagSet, f.usage, f.stdout, f.stderr), false
	}
	f.args = rest
	return 0, true
}

// parseWords is parse, then the words a command takes: from least to
// most positional arguments, and every required flag given. Anything else is
// a usage error (exit 2), said before the command reads a file or
// connects to anything.
func (f *cliFlags) parseWords(args []string, least, most int) (code int, ok bool) {
	if code, ok := f.parse(args); !ok {
		return code, false
	}
	if len(f.args) < least || len(f.args) > most {
		return f.usageError(""), false
	}
	for _, r := range f.required {
		if *r.value == "" {
			return f.usageError(r.name + " is required"), false
		}
	}
	return 0, true
}

// parseRevisions is parseWords for a command whose positional arguments
// are all revisions (1, 2, ...).
func (f *cliFlags) parseRevisions(args []string, least, most int) (revs []int64, code int, ok bool) {
	if code, ok := f.parseWords(args, least, most); !ok {
		return nil, code, false
	}
	for _, a := range f.args {
		n, err := strconv.ParseInt(a, 10, 64)
		if err != nil || n < 1 {
			return nil, f.usageError(fmt.Sprintf("%q is not a revision (1, 2, ...)", a)), false
		}
		revs = append(revs, n)
	}
	return revs, 0, true
}

// usageError prints problem (when there is one) and the usage on stderr,
// and returns 2: nothing ran.
func (f *cliFlags) usageError(problem string) int {
	if problem != "" {
		fmt.Fprintln(f.stderr, problem)
	}
	fmt.Fprintln(f.stderr, f.usage)
	return 2
}

// messageFlag is -m of push and rollback: every write to the log says why.
func (f *cliFlags) messageFlag() *string {
	m := f.String("m", "", "message (why; required)")
	f.required = append(f.required, requiredFlag{m, "-m MESSAGE"})
	return m
}

// reasonFlag is --reason of override set and delete, their why.
func (f *cliFlags) reasonFlag() *string {
	r := f.String("reason", "", "why (required)")
	f.required = append(f.required, requiredFlag{r, "--reason"})
	return r
}

// authorFlag is --author of every write: who the signer acts for.
func (f *cliFlags) authorFlag() *string {
	return f.String("author", authorDefault(os.Getenv), "author (signed: who the key holder acts for; default the key's identity alone)")
}

// scopeFlag is --scope of the override verbs that name one key's override.
func (f *cliFlags) scopeFlag() *string {
	return f.String("scope", "", "scope (default: every scope of the key)")
}

func defaultAuthor() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return "unknown"
}

// openPolicyLog connects to the log from the environment.
func openPolicyLog(getenv func(string) string) (*kafkalog.Log, error) {
	e := envconfig.New(getenv)
	brokers := e.List("KAFKA_BROKERS")
	sec := kafkaconn.FromEnv(e, getenv)
	topic := e.String("POLICY_TOPIC", kafkalog.DefaultTopic)
	if len(brokers) == 0 {
		e.Fail("KAFKA_BROKERS", "required: the policy log is on Kafka")
	}
	if err := e.Err(); err != nil {
		return nil, err
	}
	return kafkalog.New(kafkalog.Config{Brokers: brokers, Topic: topic, Security: sec, ClientID: "limiter-cli", Wait: 100 * time.Millisecond})
}

// withLog runs fn with a client that has read the whole log. A writer
// (create) creates the topic when it is missing; a reader only checks
// that it exists, and fails with one line when it does not.
func withLog(stderr io.Writer, create bool, fn func(ctx context.Context, c *policylog.Client) int) int {
	keys, err := policyKeys(os.Getenv) // keys.go
	if err != nil {
		fmt.Fprintln(stderr, "limiter: invalid configuration: "+err.Error())
		return 2
	}
	l, err := openPolicyLog(os.Getenv)
	if err != nil {
		fmt.Fprintln(stderr, "limiter: invalid configuration: "+err.Error())
		return 2
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
	defer cancel()
	check := l.Exists
	if create {
		check = l.Ensure
	}
	if err := check(ctx); err != nil {
		fmt.Fprintln(stderr, "policy log: "+err.Error())
		return 1
	}
	c := policylog.NewClient(l, true)
	keys.Use(c)
	if err := c.Sync(ctx); err != nil {
		fmt.Fprintln(stderr, "policy log: read: "+err.Error())
		return 1
	}
	return fn(ctx, c)
}

// withLogWrite is withLog for a write: the topic is created when it is
// missing, and a log that was lost (empty, yet policy_audit holds an
// earlier history: lostLog) is not written to, since every limiter that
// kept the old history would refuse the new one; restore comes first.
//
// The write's gate (trust.go) refuses, before anything is written, what
// the fleet would refuse for its keyring or its revision, and is how the
// write reports its outcome: "applied" once the fleet confirms it.
func withLogWrite(stderr io.Writer, fn func(ctx context.Context, c *policylog.Client, g *writeGate) int) int {
	keys, err := policyKeys(os.Getenv)
	if err != nil {
		fmt.Fprintln(stderr, "limiter: invalid configuration: "+err.Error())
		return 2
	}
	g := writeGateOf(keys)
	return withLog(stderr, true, func(ctx context.Context, c *policylog.Client) int {
		if lostLog(ctx, c, stderr) {
			return 1
		}
		if code, reason := g.before(ctx, c.State()); code != "" {
			printRefusal(stderr, code, reason)
			return 1
		}
		return fn(ctx, c, g)
	})
}

// WriteResult is the JSON of a write's outcome (--json, and usage-api's
// answers have the same fields).
type WriteResult struct {
	Result   string `json:"result"` // applied | refused
	Revision int64  `json:"revision"`
	Code     string `json:"code,omitempty"`
	Reason   string `json:"reason,omitempty"`
	SHA256   string `json:"sha256,omitempty"`
	// TakenBy and TakenMessage: for a conflict, who wrote the revision
	// asked for, and why.
	TakenBy      string `json:"takenBy,omitempty"`
	TakenMessage string `json:"takenMessage,omitempty"`
	// Preview: push's replay of recorded traffic under the candidate
	// (pushcheck.go).
	Preview *preview.Outcome `json:"preview,omitempty"`
}

// report prints a write's outcome and returns the exit code.
func report(o policylog.Outcome, err error, asJSON bool, stdout, stderr io.Writer) int {
	return reportWith(o, err, nil, asJSON, stdout, stderr)
}

// report is report (reportWith with pv) once the fleet has confirmed a
// write the log applied: a record the fleet refuses is reported refused.
func (g *writeGate) report(c *policylog.Client, o policylog.Outcome, err error, pv *preview.Outcome, asJSON bool, stdout, stderr io.Writer) int {
	if err == nil {
		if code, reason := g.after(o.Head, c.State().Epoch(), o.Record.SHA256, g.keys.Signer != nil); code != "" {
			res := WriteResult{Result: policylog.Refused, Revision: o.Head, Code: code, Reason: reason, SHA256: o.Record.SHA256, Preview: pv}
			if asJSON {
				_ = json.NewEncoder(stderr).Encode(res)
			} else {
				printRefusal(stderr, code, reason)
			}
			return 1
		}
	}
	return reportWith(o, err, pv, asJSON, stdout, stderr)
}

// reportWith is report, with push's preview in the JSON.
func reportWith(o policylog.Outcome, err error, pv *preview.Outcome, asJSON bool, stdout, stderr io.Writer) int {
	var ref *policylog.Refusal
	if err != nil && !errors.As(err, &ref) {
		fmt.Fprintln(stderr, "policy log: "+err.Error())
		return 1
	}
	res := WriteResult{Result: policylog.Applied, Revision: o.Head, SHA256: o.Record.SHA256}
	if ref != nil {
		res = WriteResult{Result: policylog.Refused, Revision: o.Head, Code: o.Code, Reason: o.Reason, TakenBy: o.Taken.Author, TakenMessage: o.Taken.Message}
	}
	res.Preview = pv
	if asJSON {
		out := stdout
		if ref != nil {
			out = stderr
		}
		_ = json.NewEncoder(out).Encode(res)
	} else if ref != nil {
		printRefusal(stderr, o.Code, o.Reason)
	} else {
		fmt.Fprintf(stdout, "applied: revision %d (%s, sha256 %s)\n", o.Head, o.Record.Subject(), o.Record.SHA256)
	}
	if ref != nil {
		return 1
	}
	return 0
}

// printRefusal prints why a write was refused: its code, then its reason
// line by line, indented.
func printRefusal(w io.Writer, code, reason string) {
	fmt.Fprintf(w, "refused (%s):\n", code)
	for _, line := range strings.Split(reason, "\n") {
		fmt.Fprintln(w, "  "+line)
	}
}

// Push is `limiter policy push FILE -m MESSAGE ...`. The document is
// checked whole (parse, then the stores it names) before anything is
// written; the preview of recorded traffic informs and never blocks; with
// --shadow-for and --max-newly-rejected the push opens a rollout instead.
func Push(args []string, stdout, stderr io.Writer) int {
	f := newCLIFlags("limiter policy push", policyLogUsage, stdout, stderr)
	message := f.messageFlag()
	author := f.authorFlag()
	asJSON := f.Bool("json", false, "print the outcome as JSON")
	expect := f.Int64("expect-revision", policylog.NoExpect, "refuse unless the head is this revision")
	shadowFor := f.Duration("shadow-for", 0, "a rollout: the candidate in shadow this long, then judged (docs/policy.md)")
	maxNewly := f.String("max-newly-rejected", "", "a rollout's bound: promote if at most this share (0.5% or 0.005) is newly rejected")
	replay := addPushPreviewFlags(f.FlagSet) // pushcheck.go
	if code, ok := f.parseWords(args, 1, 1); !ok {
		return code
	}
	if p := replay.problem(); p != "" {
		return f.usageError(p)
	}
	doc, err := os.ReadFile(f.args[0])
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	parsed, err := policy.Parse(doc)
	if err != nil { // every problem, before anything is written
		printRefusal(stderr, "invalid", err.Error())
		return 1
	}
	if !checkWriterStores(documentStores(parsed), os.Getenv, stderr) {
		return 1
	}
	bound, err := rolloutBound(*shadowFor, *maxNewly) // rollout.go
	if err != nil {
		return f.usageError(err.Error())
	}
	return withLogWrite(stderr, func(ctx context.Context, c *policylog.Client, g *writeGate) int {
		pv := previewPush(ctx, replay, parsed, c.State(), *asJSON, os.Getenv, stdout, stderr) // pushcheck.go
		if *shadowFor > 0 {
			o, err := c.StartRollout(ctx, string(doc), *shadowFor, bound, *author, *message, *expect)
			return reportRollout(g, c, o, err, pv, *asJSON, stdout, stderr)
		}
		o, err := c.Push(ctx, string(doc), *author, *message, *expect)
		if err == nil && o.Superseded != 0 && !*asJSON {
			fmt.Fprintf(stdout, "rollout %d superseded: its candidate is no longer in shadow, and it gets no verdict\n", o.Superseded)
		}
		return g.report(c, o, err, pv, *asJSON, stdout, stderr)
	})
}

// Rollback is `limiter policy rollback REVISION -m MESSAGE ...`: the
// document in force at REVISION, written again as a new revision.
func Rollback(args []string, stdout, stderr io.Writer) int {
	f := newCLIFlags("limiter policy rollback", policyLogUsage, stdout, stderr)
	message := f.messageFlag()
	author := f.authorFlag()
	asJSON := f.Bool("json", false, "print the outcome as JSON")
	revs, code, ok := f.parseRevisions(args, 1, 1)
	if !ok {
		return code
	}
	return withLogWrite(stderr, func(ctx context.Context, c *policylog.Client, g *writeGate) int {
		o, err := c.Rollback(ctx, revs[0], *author, *message)
		return g.report(c, o, err, nil, *asJSON, stdout, stderr)
	})
}

// History is `limiter policy history`: the last entries of the log,
// applied and refused, and the open rollout if there is one.
func History(args []string, stdout, stderr io.Writer) int {
	f := newCLIFlags("limiter policy history", policyLogUsage, stdout, stderr)
	limit := f.Int64("limit", 20, "the last N entries")
	asJSON := f.Bool("json", false, "print JSON")
	if code, ok := f.parseWords(args, 0, 0); !ok {
		return code
	}
	return withLog(stderr, false, func(_ context.Context, c *policylog.Client) int {
		return printHistory(c, int(*limit), *asJSON, stdout)
	})
}

// Show is `limiter policy show [REVISION]`: the document in force at
// REVISION (default the head), under a header of the record that wrote it.
func Show(args []string, stdout, stderr io.Writer) int {
	f := newCLIFlags("limiter policy show", policyLogUsage, stdout, stderr)
	revs, code, ok := f.parseRevisions(args, 0, 1)
	if !ok {
		return code
	}
	return withLog(stderr, false, func(_ context.Context, c *policylog.Client) int {
		rev := c.State().Head()
		if len(revs) == 1 {
			rev = revs[0]
		}
		h, ok := c.DocumentAt(rev)
		if !ok {
			fmt.Fprintf(stderr, "no document in force at revision %d\n", rev)
			return 1
		}
		fmt.Fprintf(stdout, "# revision %d by %s at %s: %s\n# sha256 %s\n", h.Revision, h.Author, h.Time.Format(time.RFC3339), h.Message, h.SHA256)
		fmt.Fprint(stdout, h.Document)
		return 0
	})
}

// Diff is `limiter policy diff REVISION_A REVISION_B`: a line diff of the
// documents in force at the two revisions.
func Diff(args []string, stdout, stderr io.Writer) int {
	f := newCLIFlags("limiter policy diff", policyLogUsage, stdout, stderr)
	revs, code, ok := f.parseRevisions(args, 2, 2)
	if !ok {
		return code
	}
	return withLog(stderr, false, func(_ context.Context, c *policylog.Client) int {
		a, okA := c.DocumentAt(revs[0])
		b, okB := c.DocumentAt(revs[1])
		if !okA || !okB {
			fmt.Fprintf(stderr, "no document in force at revision %d or %d\n", revs[0], revs[1])
			return 1
		}
		fmt.Fprintf(stdout, "--- revision %d (document of revision %d)\n+++ revision %d (document of revision %d)\n", revs[0], a.Revision, revs[1], b.Revision)
		fmt.Fprint(stdout, lineDiff(a.Document, b.Document))
		return 0
	})
}

func printHistory(c *policylog.Client, limit int, asJSON bool, stdout io.Writer) int {
	items := c.RecentHistory(limit)
	if asJSON {
		body := map[string]any{"head": c.State().Head(), "entries": items}
		if ro := policylog.RolloutInfoOf(c.State()); ro != nil {
			body["rollout"] = ro
		}
		_ = json.NewEncoder(stdout).Encode(body)
		return 0
	}
	fmt.Fprintf(stdout, "head: revision %d\n", c.State().Head())
	if ro := policylog.RolloutInfoOf(c.State()); ro != nil {
		fmt.Fprintf(stdout, "open rollout: revision %d by %s, in shadow until %s, max newly rejected %s\n", ro.Revision, ro.Author, ro.EndsAt.Format(time.RFC3339), policylog.FormatShare(ro.MaxNewlyRejected))
	}
	for _, h := range items {
		what := h.Subject
		if what == "" {
			what = "log key " + h.LogKey
		}
		line := fmt.Sprintf("%6d  %-8s  %-20s  %-12s  %s  %q", h.Revision, h.Result, what, h.Author, h.Time.Format(time.RFC3339), h.Message)
		if h.Result == policylog.Refused {
			line += fmt.Sprintf("  (%s: %s)", h.Code, firstLine(h.Reason))
		}
		fmt.Fprintln(stdout, line)
	}
	return 0
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i] + " ..."
	}
	return s
}

// lineDiff is a line diff of a and b ("-", "+", " " prefixes), from the
// longest common subsequence; documents beyond 4,000 lines are compared
// only as different.
func lineDiff(a, b string) string {
	x, y := strings.SplitAfter(a, "\n"), strings.SplitAfter(b, "\n")
	if len(x)*len(y) > 16_000_000 {
		return "(documents too large to diff line by line)\n"
	}
	n, m := len(x), len(y)
	lcs := make([][]int32, n+1)
	for i := range lcs {
		lcs[i] = make([]int32, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if x[i] == y[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var sb strings.Builder
	line := func(p, s string) {
		if s == "" {
			return
		}
		sb.WriteString(p + strings.TrimSuffix(s, "\n") + "\n")
	}
	i, j := 0, 0
	for i < n && j < m {
		switch {
		case x[i] == y[j]:
			line(" ", x[i])
			i++
			j++
		case lcs[i+1][j] >= lcs[i][j+1]:
			line("-", x[i])
			i++
		default:
			line("+", y[j])
			j++
		}
	}
	for ; i < n; i++ {
		line("-", x[i])
	}
	for ; j < m; j++ {
		line("+", y[j])
	}
	return sb.String()
}
