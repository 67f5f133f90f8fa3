package judge_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/internal/kafkaconn"
	"github.com/ratewarden/ratewarden/metering"
	"github.com/ratewarden/ratewarden/metering/chsink"
	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/policylog/judge"
	"github.com/ratewarden/ratewarden/policylog/kafkalog"
	"github.com/ratewarden/ratewarden/schema"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

const base = "version: 1\ndefault_tier: free\ntiers:\n  free: { rate: 10, burst: 20 }\n  pro: { rate: 100, burst: 200 }\n"

// TestJudgeDecides runs two judges against kfake and ClickHouse: one is
// elected; it promotes a rollout within its bound, withdraws one above it
// and one no decision was evaluated under, each verdict once, with the
// counts the rollup holds.
func TestJudgeDecides(t *testing.T) {
	k := testenv.StartKafka(t, "ratelimit.decisions", 1)
	ch := testenv.StartClickHouse(t)
	conn := ch.Conn(t)
	db := ch.Database(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	if err := schema.Apply(ctx, conn, db); err != nil {
		t.Fatal(err)
	}
	sink, err := chsink.New(conn, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	newLog := func() *kafkalog.Log {
		l, err := kafkalog.New(kafkalog.Config{Brokers: []string{k.Addr()}, Security: &kafkaconn.Security{}, Wait: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Close)
		return l
	}
	w := policylog.NewClient(newLog(), true)
	if err := newLog().Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Push(ctx, base, "alice", "base", policylog.NoExpect); err != nil {
		t.Fatal(err)
	}

	// The meter-consumer's rollup of decisions under rollout rev: n
	// decisions, newly of them newly rejected.
	offset := int64(0)
	rollup := func(rev int64, n, newly int) {
		t.Helper()
		var recs []chsink.Record
		now := time.Now().UTC()
		for i := range n {
			recs = append(recs, chsink.Record{Offset: offset, Event: metering.Event{
				EventID: fmt.Sprintf("e%d", offset), TS: now.UnixMilli(), Key: fmt.Sprintf("k%d", i%5), Scope: "s",
				Allowed: true, Shadow: "free", ShadowRejected: i < newly, ShadowRevision: rev}})
			offset++
		}
		p, err := sink.Progress(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := sink.Write(ctx, 0, recs, offset-1, &p); err != nil {
			t.Fatal(err)
		}
	}

	var judges []*judge.Judge
	var wg sync.WaitGroup
	jctx, stop := context.WithCancel(context.Background())
	t.Cleanup(func() { stop(); wg.Wait() })
	for i := range 2 {
		j, err := judge.New(judge.Config{
			Log: newLog(), Counter: judge.ClickHouse{Conn: conn, Database: db},
			Brokers: []string{k.Addr()}, Topic: kafkalog.DefaultTopic, Dialer: (&kafkaconn.Security{}).Dialer("judge-test", 5*time.Second),
			SessionTimeout: 2 * time.Second, Settle: 100 * time.Millisecond, Name: fmt.Sprintf("judge-%d", i),
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		if err != nil {
			t.Fatal(err)
		}
		judges = append(judges, j)
		wg.Add(1)
		go func() { defer wg.Done(); _ = j.Run(jctx) }()
	}
	waitFor(t, "one judge elected", func() bool { return judges[0].Leading() != judges[1].Leading() })

	for _, c := range []struct {
		n, newly int
		decision string
		reason   string
	}{
		{1000, 3, policylog.Promote, "0.3% newly rejected (3 of 1000 decisions), within the bound of 0.5%"},
		{200, 2, policylog.Withdraw, "1% newly rejected (2 of 200 decisions), above the bound of 0.5%"},
		{0, 0, policylog.Withdraw, "no decision was evaluated under the candidate"},
	} {
		rev := w.State().Head() + 1
		rollup(rev, c.n, c.newly)
		o, err := w.StartRollout(ctx, base+fmt.Sprintf("# candidate %d\n", rev), 500*time.Millisecond, 0.005, "alice", "try", policylog.NoExpect)
		if err != nil || o.Head != rev {
			t.Fatalf("rollout: %d %v, want revision %d", o.Head, err, rev)
		}
		var v *policylog.Verdict
		var author string
		waitFor(t, fmt.Sprintf("a verdict on rollout %d", rev), func() bool {
			if err := w.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			if _, open := w.State().Rollout(); open {
				return false
			}
			m, _ := w.State().ClosedBy(rev)
			author = m.Author
			return true
		})
		// The verdict record itself, read back from the log.
		st := policylog.NewState(true)
		var entries []policylog.Entry
		for l := newLog(); ; {
			batch, end, err := l.Fetch(ctx, st.NextOffset())
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range batch {
				if e.Offset >= st.NextOffset() {
					st.Apply(e)
					entries = append(entries, e)
				}
			}
			if st.NextOffset() >= end {
				break
			}
		}
		st = policylog.NewState(true)
		verdicts := 0
		for _, e := range entries {
			o := st.Apply(e)
			if o.Record.Kind == policylog.KindVerdict && o.Record.Verdict.Rollout == rev {
				verdicts++
				if o.Result == policylog.Applied {
					v = o.Record.Verdict
				}
			}
		}
		if verdicts != 1 || v == nil {
			t.Fatalf("rollout %d: %d verdicts, applied %+v", rev, verdicts, v)
		}
		if v.Decision != c.decision || v.Decisions != uint64(c.n) || v.NewlyRejected != uint64(c.newly) || !strings.Contains(v.Reason, c.reason) || !strings.HasPrefix(author, "judge-") {
			t.Errorf("rollout %d: %+v by %s; want %s of %d/%d (%q)", rev, *v, author, c.decision, c.newly, c.n, c.reason)
		}
		if w.State().Head() != rev+1 {
			t.Errorf("after rollout %d's verdict the head is %d, want %d", rev, w.State().Head(), rev+1)
		}
	}
	_, rec := w.State().Document()
	if !strings.Contains(rec.Document, "# candidate 2\n") {
		t.Errorf("the document in force is not the promoted candidate of rollout 2: %q", rec.Document)
	}
	for i, j := range judges {
		if ok, why := j.Ready(); !ok {
			t.Errorf("judge %d not ready: %s", i, why)
		}
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testenv.Timeout(60 * time.Second))
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 60 s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
