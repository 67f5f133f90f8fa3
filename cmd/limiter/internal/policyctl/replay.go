package policyctl

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/ratewarden/ratewarden/enforcement/replay"
	"github.com/ratewarden/ratewarden/internal/chconn"
	"github.com/ratewarden/ratewarden/internal/cli"
	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/metering/rawscan"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/policylog/chaudit"
	"github.com/ratewarden/ratewarden/policylog/preview"
	"github.com/ratewarden/ratewarden/schema"
)

const replayUsage = `usage: limiter policy replay [FILE] (--from T --to T | --since D) [--sample F] [--top N] [--json]
      [--tolerance D] [--window D] [--clickhouse-addr A] [--database DB]
  Replays the decisions recorded in ClickHouse (decisions_raw) over [from, to)
  under the candidate policy FILE, each at its actual cost (settles and
  charges replayed as they were), and reports what it would have rejected.
  Without FILE the candidate is the policy log's state in force at the
  range's start (document and overrides), rebuilt from policy_audit: the
  check that the record is reproduced. Never touches Redis. CLICKHOUSE_ADDR, CLICKHOUSE_DATABASE, CLICKHOUSE_USER
  CLICKHOUSE_PASSWORD (or CLICKHOUSE_PASSWORD_FILE), CLICKHOUSE_TLS and
  CLICKHOUSE_TLS_CA_FILE are read as the services read them.`

// replayArgs are the parsed flags of `limiter policy replay`.
type replayArgs struct {
	file         string
	from, to     time.Time
	sample       float64
	top          int
	asJSON       bool
	tolerance    time.Duration
	window       time.Duration
	queryTimeout time.Duration
	ch           chconn.Config // from CLICKHOUSE_*; --clickhouse-addr and --database override
}

// parseReplayArgs parses the words of `limiter policy replay`; an error
// from cli.Parse (an unknown flag, --help) is returned as it is, for
// cli.FlagExit.
func parseReplayArgs(args []string, getenv func(string) string, now time.Time) (replayArgs, *flag.FlagSet, error) {
	fs := cli.NewFlagSet("limiter policy replay")
	a := replayArgs{}
	from := fs.String("from", "", "start of the range, RFC 3339 (inclusive)")
	to := fs.String("to", "", "end of the range, RFC 3339 (exclusive)")
	since := fs.Duration("since", 0, "the range is the last D before now (instead of --from/--to)")
	fs.Float64Var(&a.sample, "sample", 1, "fraction of keys to replay, (0, 1]; sampled by key, so a sampled key replays exactly")
	fs.IntVar(&a.top, "top", 10, "keys to list")
	fs.BoolVar(&a.asJSON, "json", false, "JSON for CI instead of tables")
	fs.DurationVar(&a.tolerance, "tolerance", 10*time.Millisecond, "how close to a bucket boundary a recorded decision may be for a different replayed verdict to count as clock granularity")
	fs.DurationVar(&a.window, "window", time.Hour, "read the range in windows of this length (one query each)")
	fs.DurationVar(&a.queryTimeout, "query-timeout", 10*time.Minute, "deadline of one window's query")
	// The connection is the services' (internal/chconn): user, password
	// (or its _FILE), TLS on the secure native port.
	env := envconfig.New(getenv)
	a.ch = chconn.FromEnv(env, schema.ValidDatabase)
	fs.StringVar(&a.ch.Addr, "clickhouse-addr", a.ch.Addr, "ClickHouse native address")
	fs.StringVar(&a.ch.Database, "database", a.ch.Database, "ClickHouse database")
	files, err := cli.Parse(fs, args) // FILE may come before or after the flags
	if err != nil {
		return a, fs, err // a word refused, or --help: before the environment's problems
	}
	if err := env.Err(); err != nil {
		return a, fs, err
	}
	var problems []string
	switch len(files) {
	case 0: // the policy in force at --from, from policy_audit
	case 1:
		a.file = files[0]
	default:
		problems = append(problems, "at most one candidate policy FILE")
	}
	switch {
	case *since > 0 && (*from != "" || *to != ""):
		problems = append(problems, "--since and --from/--to exclude each other")
	case *since > 0:
		a.from, a.to = now.Add(-*since), now
	case *from == "" || *to == "":
		problems = append(problems, "--from and --to (or --since) are required")
	default:
		var err error
		if a.from, err = time.Parse(time.RFC3339, *from); err != nil {
			problems = append(problems, "--from: "+err.Error())
		}
		if a.to, err = time.Parse(time.RFC3339, *to); err != nil {
			problems = append(problems, "--to: "+err.Error())
		}
	}
	if a.sample <= 0 || a.sample > 1 {
		problems = append(problems, fmt.Sprintf("--sample must be in (0, 1], got %v", a.sample))
	}
	if len(problems) > 0 {
		return a, fs, errReplayArgs{strings.Join(problems, "; ")}
	}
	return a, fs, nil
}

// errReplayArgs is a problem with well-formed words (a missing FILE, flags
// that exclude each other).
type errReplayArgs struct{ problem string }

func (e errReplayArgs) Error() string { return e.problem }

// replayCommand runs `limiter policy replay` and returns the exit code.
func replayCommand(args []string, stdout, stderr io.Writer) int {
	a, fs, err := parseReplayArgs(args, os.Getenv, time.Now().UTC())
	var problem errReplayArgs
	switch {
	case errors.As(err, &problem):
		return cli.Refuse(problem.problem, fs, replayUsage, stderr)
	case err != nil:
		return cli.FlagExit(err, fs, replayUsage, stdout, stderr)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	out, err := runReplay(ctx, a)
	if err != nil {
		fmt.Fprintln(stderr, "replay failed: "+err.Error())
		return 1
	}
	if a.asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			fmt.Fprintln(stderr, "replay: "+err.Error())
			return 1
		}
		return 0
	}
	writeReplayTable(stdout, out)
	return 0
}

// replayOutput is the report with what produced it (the JSON for CI).
type replayOutput struct {
	Candidate     string    `json:"candidate"`
	CandidateHash string    `json:"candidateSha256"`
	From          time.Time `json:"from"`
	To            time.Time `json:"to"`
	Sample        float64   `json:"sample"`
	Seconds       float64   `json:"seconds"`
	RowsPerSecond float64   `json:"rowsPerSecond"`
	replay.Report
}

// runReplay streams the range through the engine.
func runReplay(ctx context.Context, a replayArgs) (replayOutput, error) {
	var p *policy.Policy
	var err error
	if a.file != "" { // a bad file fails before any connection
		if p, err = policy.Load(a.file); err != nil {
			return replayOutput{}, err
		}
	}
	// ReadTimeout is per block read; each window query has its own deadline too.
	conn, err := a.ch.Open(chconn.Tuning{DialTimeout: 3 * time.Second, ReadTimeout: time.Minute})
	if err != nil {
		return replayOutput{}, err
	}
	defer conn.Close()
	var candidate replay.Resolver = p
	name := a.file
	if a.file == "" {
		qctx, cancel := context.WithTimeout(ctx, a.queryTimeout)
		st, epoch, err := chaudit.InForce(qctx, conn, a.ch.Database, a.from)
		cancel()
		if err != nil {
			return replayOutput{}, err
		}
		from := a.from
		snap := st.Snapshot(func() time.Time { return from }) // overrides' expiry as at the range's start
		if snap == nil {
			return replayOutput{}, fmt.Errorf("policy_audit: no document of the policy log was in force at %s (give a FILE)", a.from.Format(time.RFC3339))
		}
		_, rec := st.Document()
		candidate, p = snap, snap.Policy
		name = fmt.Sprintf("policy_audit: revision %d (epoch %d; document of revision %d by %s; %d overrides), in force at %s",
			st.Head(), epoch, rec.Revision, rec.Author, st.Overrides(), a.from.Format(time.RFC3339))
	}
	eng := replay.New(replay.Config{Policy: candidate, TopKeys: a.top, Tolerance: a.tolerance})
	began := time.Now()
	q := rawscan.Query{Database: a.ch.Database, From: a.from, To: a.to, Sample: a.sample}
	err = rawscan.Scan(ctx, conn, q, a.window, a.queryTimeout, func(r *rawscan.Row) error {
		eng.Add(preview.ReplayRow(r))
		return nil
	})
	if err != nil {
		return replayOutput{}, err
	}
	took := time.Since(began)
	rep := eng.Report()
	out := replayOutput{Candidate: name, CandidateHash: p.Hash(), From: a.from.UTC(), To: a.to.UTC(),
		Sample: a.sample, Seconds: took.Seconds(), Report: rep}
	if took > 0 {
		out.RowsPerSecond = float64(rep.Rows) / took.Seconds()
	}
	return out, nil
}

func writeReplayTable(w io.Writer, o replayOutput) {
	fmt.Fprintf(w, "replay of %s (sha256 %.12s) over [%s, %s)\n", o.Candidate, o.CandidateHash,
		o.From.Format(time.RFC3339), o.To.Format(time.RFC3339))
	sample := "every key"
	if o.Sample < 1 {
		sample = fmt.Sprintf("%.4g of keys (by key hash): multiply counts by %.4g for all traffic", o.Sample, 1/o.Sample)
	}
	fmt.Fprintf(w, "decisions replayed: %d in %.1f s (%.0f/s); sample: %s\n", o.Rows, o.Seconds, o.RowsPerSecond, sample)
	if st := o.Settlements; st.Settles > 0 || st.Charges > 0 {
		fmt.Fprintf(w, "at actual costs: %d settles (%d of a reservation the replay does not hold), %d charges; tokens spent then %d, under the candidate %d\n",
			st.Settles, st.Unmatched, st.Charges, o.ActualCost.Recorded, o.ActualCost.Replayed)
	}
	if o.QuotaResets > 0 {
		fmt.Fprintf(w, "quota resets by support: %d (each set the candidate's quota of its key back to zero there)\n", o.QuotaResets)
	}
	t := o.Total
	fmt.Fprintf(w, "rejected then: %d (%s); rejected under the candidate: %d (%s); newly rejected %d, newly allowed %d\n",
		t.RecordedRejected, pct(t.RecordedRejected, t.Decisions), t.Rejected, pct(t.Rejected, t.Decisions), t.NewlyRejected, t.NewlyAllowed)
	ag := o.Agreement
	fmt.Fprintf(w, "recorded shared decisions reproduced: %d of %d agree, %d differ within %s of a bucket boundary (clock granularity), %d differ beyond\n",
		ag.Agree, ag.Compared, ag.DifferWithinClock, time.Duration(ag.ToleranceMicros)*time.Microsecond, ag.DifferBeyondClock)
	fmt.Fprintln(w, "  (a check of the replay only when the candidate is the policy that was in force)")

	fmt.Fprintln(w, "\nper rule of the candidate:")
	tw := tabwriter.NewWriter(w, 2, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  rule\tdecisions\trejected then\trejected now\tnewly rejected\tnewly allowed\tdry-run would reject")
	names := make([]string, 0, len(o.Rules))
	for n := range o.Rules {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		a, b := o.Rules[names[i]], o.Rules[names[j]]
		if a.Rejected != b.Rejected {
			return a.Rejected > b.Rejected
		}
		return names[i] < names[j]
	})
	for _, n := range names {
		c := o.Rules[n]
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%d (%s)\t%d\t%d\t%d\n", n, c.Decisions, c.RecordedRejected, c.Rejected, pct(c.Rejected, c.Decisions), c.NewlyRejected, c.NewlyAllowed, c.DryRunWouldReject)
	}
	tw.Flush()
	fmt.Fprintf(w, "\ntop %d keys by rejections under the candidate:\n", len(o.TopKeys))
	tw = tabwriter.NewWriter(w, 2, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  key\tdecisions\trejected then\trejected now\tnewly rejected\tfirst limited now\tfirst limited then")
	for _, k := range o.TopKeys {
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\t%d\t%s\t%s\n", k.Key, k.Decisions, k.RecordedRejected, k.Rejected, k.NewlyRejected, when(k.FirstLimited), when(k.FirstRecordedLimited))
	}
	tw.Flush()
	if o.Untracked > 0 {
		fmt.Fprintf(w, "(%d decisions of keys beyond the tracked %d are in the totals, not in the key list)\n", o.Untracked, o.Keys)
	}
	if o.FirstDifference != "" {
		fmt.Fprintln(w, "first difference beyond the tolerance: "+o.FirstDifference)
	}
}

func pct(n, of int64) string {
	if of == 0 {
		return "0%"
	}
	return fmt.Sprintf("%.2f%%", float64(n)/float64(of)*100)
}

func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Format("2006-01-02T15:04:05.000Z")
}
