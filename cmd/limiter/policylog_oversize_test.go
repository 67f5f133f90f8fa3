package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/internal/kafkaconn"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/policylog/kafkalog"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestPolicyLogOversizedDocument: `policy push` of a document beyond
// policy.MaxFileSize is refused with the sizes and writes nothing; a record
// beyond policylog.MaxRecord written straight to the topic (a writer that
// skips the checks) is refused by the tailing limiter — as invalid when its
// document is beyond the file bound, as garbled when the record is beyond
// the record bound (read no further than it) — counted, and changes
// nothing: the revision in force stays, and the next push
// applies on top of it.
func TestPolicyLogOversizedDocument(t *testing.T) {
	t.Parallel()
	k := testenv.StartKafka(t, "ratelimit.decisions", 1)
	env := []string{"KAFKA_BROKERS=" + k.Addr()}
	if out, errOut, code := runCLI(t, env, "policy", "push", writeTemp(t, "a.yaml", logDocA), "-m", "first", "--author", "alice"); code != 0 {
		t.Fatalf("push: %d %q %q", code, out, errOut)
	}
	p := startLimiter(t, logBootstrap, append(env, "POLICY_SOURCE=kafka", "LIMITER_GRPC_ADDR=")...)
	waitRevision(t, p, 1)

	// A valid document padded with a comment past the bound.
	big := logDocA + "# " + strings.Repeat("x", policy.MaxFileSize) + "\n"
	out, errOut, code := runCLI(t, env, "policy", "push", writeTemp(t, "big.yaml", big), "-m", "too big", "--author", "mallory")
	if code != 1 || !strings.Contains(errOut, "refused (invalid)") || !strings.Contains(errOut, "more than 4194304") {
		t.Fatalf("push of %d bytes: exit %d, stdout %q, stderr %q; want exit 1, refused with the sizes", len(big), code, out, errOut)
	}
	if hist, _, _ := runCLI(t, env, "policy", "history", "--json"); !strings.Contains(hist, `"head":1`) || strings.Contains(hist, "mallory") {
		t.Fatalf("history after the refused push: %s", hist)
	}

	// Straight to the topic, past the checks.
	l, err := kafkalog.New(kafkalog.Config{Brokers: []string{k.Addr()}, Security: &kafkaconn.Security{}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	huge := logDocA + "# " + strings.Repeat("x", policylog.MaxRecord) + "\n"
	for _, doc := range []string{big, huge} {
		rec := policylog.Record{Revision: 2, Parent: 1, Kind: policylog.KindPolicy, Document: doc, Author: "mallory", Message: "straight", Time: time.Now().UTC()}
		rec.Seal()
		v, err := rec.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Append(ctx, policylog.DocumentKey, v); err != nil {
			t.Fatalf("append %d bytes: %v", len(v), err)
		}
	}
	waitFor(t, "the oversized records refused", 30*time.Second, func() bool {
		return p.metric(t, `limiter_policy_log_records_total{code="invalid",result="refused"}`) == 1 &&
			p.metric(t, `limiter_policy_log_records_total{code="garbled",result="refused"}`) == 1
	})
	if pol := p.policyOf(t); pol["revision"] != float64(1) || pol["author"] != "alice" {
		t.Fatalf("after the oversized record: %v, want revision 1 by alice in force", pol)
	}
	if out, errOut, code := runCLI(t, env, "policy", "push", writeTemp(t, "b.yaml", logDocA+"# b\n"), "-m", "second", "--author", "bob"); code != 0 || !strings.Contains(out, "applied: revision 2") {
		t.Fatalf("the next push: %d %q %q", code, out, errOut)
	}
	waitRevision(t, p, 2)
}
