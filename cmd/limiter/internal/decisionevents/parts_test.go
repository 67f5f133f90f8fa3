package decisionevents

import (
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/metering/kafkaemit"
)

// Without KAFKA_BROKERS metering is off: no recorder (a nil interface for
// enforcement.Config), no metering entry in /readyz, and its actions do
// nothing.
func TestMeteringOff(t *testing.T) {
	p, err := Build(Config{}, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if p.Recorder != nil || p.Status() != nil {
		t.Fatalf("metering off: recorder %v, status %+v; want neither", p.Recorder, p.Status())
	}
	p.OnHUP()
	p.FollowRevision(func() int64 { return 1 })
	p.Add(nil)
}

func TestStatus(t *testing.T) {
	ok, why := false, "SASL authentication failed: check KAFKA_SASL_PASSWORD"
	p := Parts{ready: func() (bool, string) { return ok, why }, spool: func() (kafkaemit.SpoolStatus, bool) {
		return kafkaemit.SpoolStatus{Bytes: 10, MaxBytes: 100, Events: 2, OldestAge: 1500 * time.Millisecond, WaitingForKafka: true}, true
	}}
	s := p.Status()
	if s.Status != "failing" || s.Reason != why || s.Spool == nil || s.Spool.OldestAgeSeconds != 1.5 || !s.Spool.WaitingForKafka {
		t.Errorf("refused credential with a spool: %+v %+v", s, s.Spool)
	}
	ok = true
	p.spool = func() (kafkaemit.SpoolStatus, bool) { return kafkaemit.SpoolStatus{}, false }
	if s := p.Status(); s.Status != "ok" || s.Reason != "" || s.Spool != nil {
		t.Errorf("ok without a spool: %+v", s)
	}
}
