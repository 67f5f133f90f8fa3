package policylog_test

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/policylog"
)

// benchOverrides is the size of the log of BenchmarkStateLoad1M.
const benchOverrides = 1_000_000

// BenchmarkStateLoad1M is a limiter's start on a log of 1,000,000
// overrides: each record encoded (as the log holds it), decoded, checked
// (content hash, validation) and applied, then one Snapshot (what is
// swapped in). It reports the seconds of the whole load and the live heap
// per override of the State and of the snapshot, for a limiter (records
// not kept) and a writer (records kept).
func BenchmarkStateLoad1M(b *testing.B) {
	b.Run("limiter", func(b *testing.B) { benchStateLoad(b, false) })
	b.Run("writer", func(b *testing.B) { benchStateLoad(b, true) })
}

// benchStateLoad is BenchmarkStateLoad1M for a State that keeps records
// (a writer) or not (a limiter).
func benchStateLoad(b *testing.B, keep bool) {
	n := benchOverrides
	for range b.N {
		runtime.GC()
		var m0 runtime.MemStats
		runtime.ReadMemStats(&m0)
		start := time.Now()
		s := policylog.NewState(keep)
		s.Apply(entry(0, doc(1, 0, docA, "alice")))
		for i := range n {
			o := &policy.Override{Tier: "pro", Reason: "negotiated deal"}
			if i%2 == 1 {
				o = &policy.Override{Rate: 50, Burst: 100, Reason: "negotiated deal"}
			}
			r := ovr(int64(i+2), int64(i+1), fmt.Sprintf("acct_%07d", i), "", o)
			if out := s.Apply(entry(int64(i+1), r)); out.Result != policylog.Applied {
				b.Fatalf("record %d: %s", i, out.Reason)
			}
		}
		snap := s.Snapshot(nil)
		took := time.Since(start)
		runtime.GC()
		var m1 runtime.MemStats
		runtime.ReadMemStats(&m1)
		b.ReportMetric(took.Seconds(), "s/load")
		b.ReportMetric(float64(m1.HeapAlloc-m0.HeapAlloc)/float64(n), "bytes/override")
		runtime.KeepAlive(s)
		runtime.KeepAlive(snap)
	}
}

// BenchmarkDigest1M is State.Digest on 1,000,000 overrides: what a
// follower adds to publishing a revision (after it is in force); its
// sub-benchmark checkpoint is State.CheckpointDigest, what a start that
// relies on a checkpoint, and a writer of one, computes once.
func BenchmarkDigest1M(b *testing.B) {
	s := policylog.NewState(false)
	s.Apply(entry(0, doc(1, 0, docA, "alice")))
	for i := range benchOverrides {
		o := &policy.Override{Tier: "pro", Reason: "negotiated deal"}
		if i%2 == 1 {
			o = &policy.Override{Rate: 50, Burst: 100, Reason: "negotiated deal"}
		}
		s.Apply(entry(int64(i+1), ovr(int64(i+2), int64(i+1), fmt.Sprintf("acct_%07d", i), "", o)))
	}
	b.ResetTimer()
	b.Run("digest", func(b *testing.B) {
		for range b.N {
			if s.Digest() == "" {
				b.Fatal("no digest")
			}
		}
	})
	b.Run("checkpoint", func(b *testing.B) {
		for range b.N {
			if s.CheckpointDigest() == "" {
				b.Fatal("no digest")
			}
		}
	})
}
