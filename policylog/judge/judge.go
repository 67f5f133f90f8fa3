// Package judge is the rollout judge: the one process of the fleet that
// writes the verdict of a rollout of the policy log once its shadow window
// is over (policylog/rollout.go).
//
// # Exactly one judge
//
// Every judge joins one Kafka consumer group on the policy topic, which
// has one partition; the member the group assigns that partition to is
// the judge, the others wait for a rebalance. Nothing else depends on the
// group: the log is read from its start with a policylog.Client, and no
// offset is committed. A judge that dies mid-rollout leaves the group
// (or its session expires) and the next owner reads the log, finds the
// rollout still open and judges it. Two owners at once — the old one not
// yet told of a rebalance — may both write a verdict; the apply rule
// accepts one verdict per rollout, so only the first applies, everywhere,
// and the other is refused (and audited in policy_audit like any record).
//
// # The verdict
//
// Once a rollout's end has passed by Settle (time for the limiters'
// events to reach ClickHouse), the judge reads the rollout's shadow
// counters (Counter: rollout_shadow, rolled up by meter-consumer) and
// writes promote when the newly rejected share is at most the rollout's
// bound, else withdraw, with the measurement in the record. A rollout its
// candidate evaluated no decision of is withdrawn: a check that saw no
// traffic proves nothing, and promote is the step that needs proof. A
// promote the apply rule refuses (an override added meanwhile uses a tier
// the candidate drops) becomes a withdraw that says why. A Counter that
// fails is retried every second and counted; no verdict is written
// without a measurement.
package judge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/ratewarden/ratewarden/internal/kafkaconn"
	"github.com/ratewarden/ratewarden/internal/promdecl"
	"github.com/ratewarden/ratewarden/policylog"
)

// Counter reads what a rollout's candidate decided in shadow: decisions
// evaluated, and newly rejected (allowed by the policy in force, denied by
// the candidate).
type Counter interface {
	Count(ctx context.Context, rollout int64) (decisions, newlyRejected uint64, err error)
}

// DefaultSettle is how long after a rollout's end its counters are read
// (POLICY_JUDGE_SETTLE).
const DefaultSettle = 30 * time.Second

// Config configures a Judge. Zero durations take the defaults.
type Config struct {
	Log     policylog.Log // the policy log, read and written; required
	Counter Counter       // required
	// Brokers, Topic and Dialer reach the consumer group that elects the
	// judge (Topic: the policy log's topic). Required.
	Brokers []string
	Topic   string
	Dialer  *kafka.Dialer
	// GroupID is the group (default "ratewarden-judge").
	GroupID string
	// SessionTimeout: how long a dead judge holds the role (default
	// kafkaconn.GroupSessionTimeout).
	SessionTimeout time.Duration
	// Settle is how long after a rollout's end the judge waits before
	// reading its counters (default DefaultSettle): the limiters' event
	// buffers and the meter-consumer's batches.
	Settle time.Duration
	// Name is the verdicts' author (default "judge").
	Name     string
	Logger   *slog.Logger // required
	Registry prometheus.Registerer
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Keys: the keyring the judge reads the log with (records not signed
	// by it are refused) and the key it signs its verdicts with, which
	// readers then author by that key's identity rather than Name.
	Keys policylog.Keys
}

// Judge is one candidate for the judge role. Run does the work; Ready and
// Leading are safe from any goroutine.
type Judge struct {
	cfg     Config
	m       metrics
	leading atomic.Bool
	status  atomic.Pointer[string] // "" = ok
}

type metrics struct {
	leader   prometheus.Gauge
	verdicts *prometheus.CounterVec
	share    prometheus.Gauge
	errors   prometheus.Counter
	overdue  prometheus.Gauge
}

// New validates cfg and registers the judge's metrics; it starts nothing.
func New(cfg Config) (*Judge, error) {
	if cfg.Log == nil || cfg.Counter == nil || len(cfg.Brokers) == 0 || cfg.Topic == "" || cfg.Dialer == nil || cfg.Logger == nil {
		return nil, errors.New("judge: Log, Counter, Brokers, Topic, Dialer and Logger are required")
	}
	if cfg.GroupID == "" {
		cfg.GroupID = "ratewarden-judge"
	}
	if cfg.SessionTimeout <= 0 {
		cfg.SessionTimeout = kafkaconn.GroupSessionTimeout
	}
	if cfg.Settle <= 0 {
		cfg.Settle = DefaultSettle
	}
	if cfg.Name == "" {
		cfg.Name = "judge"
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	j := &Judge{cfg: cfg, m: metrics{
		leader:   promdecl.Gauge("meter_rollout_judge_leader", "1 while this process is the rollout judge (it holds the policy topic's partition in the judge's consumer group)."),
		verdicts: promdecl.CounterVec("meter_rollout_verdicts_total", "Rollout verdicts this judge wrote, by decision (promote, withdraw) and result (applied, refused: another judge decided first).", "decision", "result"),
		share:    promdecl.Gauge("meter_rollout_newly_rejected_ratio", "Newly rejected share measured for the last rollout this judge decided (newly rejected / decisions under its candidate)."),
		errors:   promdecl.Counter("meter_rollout_judge_errors_total", "Failed reads of the rollout counters or the policy log, or failed verdict writes; retried."),
		overdue:  promdecl.Gauge("meter_rollout_overdue_seconds", "Seconds the open rollout is past its end plus the settle time without a verdict (0 when none is due), on the judge."),
	}}
	for _, d := range []string{policylog.Promote, policylog.Withdraw} {
		for _, r := range []string{policylog.Applied, policylog.Refused} {
			j.m.verdicts.WithLabelValues(d, r)
		}
	}
	if cfg.Registry != nil {
		cfg.Registry.MustRegister(j.m.leader, j.m.verdicts, j.m.share, j.m.errors, j.m.overdue)
	}
	s := "rollout judge: not a member of group " + cfg.GroupID + " yet"
	j.status.Store(&s)
	return j, nil
}

// Leading reports whether this process is the judge now.
func (j *Judge) Leading() bool { return j.leading.Load() }

// Ready is false, with the reason, while the judge cannot take part in the
// election or, as the judge, cannot read what it needs.
func (j *Judge) Ready() (bool, string) {
	s := *j.status.Load()
	return s == "", s
}

func (j *Judge) setStatus(s string) { j.status.Store(&s) }

// Run takes part in the election until ctx ends and judges while it holds
// the partition; it returns after leaving the group.
func (j *Judge) Run(ctx context.Context) error {
	gc := kafkaconn.GroupConfig(j.cfg.GroupID, j.cfg.Brokers, j.cfg.Topic, j.cfg.Dialer, j.cfg.SessionTimeout)
	gc.RebalanceTimeout = j.cfg.SessionTimeout
	group, err := kafka.NewConsumerGroup(gc)
	if err != nil {
		return fmt.Errorf("judge: group %s: %w", j.cfg.GroupID, err)
	}
	for {
		gen, err := group.Next(ctx)
		if ctx.Err() != nil {
			break
		}
		if err != nil {
			j.errors()
			j.setStatus("rollout judge: no generation of group " + j.cfg.GroupID + ": " + err.Error())
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		j.setStatus("")
		owns := false
		for _, pa := range gen.Assignments[j.cfg.Topic] {
			owns = owns || pa.ID == 0
		}
		j.cfg.Logger.Info("rollout judge: group generation", "generation", gen.ID, "member", gen.MemberID, "judge", owns)
		if owns {
			gen.Start(func(gctx context.Context) { j.lead(gctx) })
		}
	}
	if err := group.Close(); err != nil {
		j.cfg.Logger.Warn("rollout judge: leave the group", "err", err)
	}
	return nil
}

func (j *Judge) errors() { j.m.errors.Inc() }

// lead judges until gctx ends (this generation lost the partition, or the
// process stops).
func (j *Judge) lead(gctx context.Context) {
	j.leading.Store(true)
	j.m.leader.Set(1)
	j.cfg.Logger.Info("rollout judge: this process is the judge")
	defer func() {
		j.leading.Store(false)
		j.m.leader.Set(0)
		j.m.overdue.Set(0)
		j.cfg.Logger.Info("rollout judge: no longer the judge")
	}()
	c := policylog.NewClient(j.cfg.Log, false)
	j.cfg.Keys.Use(c)
	failing := false
	for gctx.Err() == nil {
		_, err := c.Poll(gctx) // waits briefly at the broker for new records
		if err != nil && !errors.Is(err, policylog.ErrStartedOver) {
			if gctx.Err() != nil {
				return
			}
			j.errors()
			if !failing {
				j.cfg.Logger.Warn("rollout judge: cannot read the policy log; retrying", "err", err)
			}
			failing = true
			j.setStatus("rollout judge: cannot read the policy log: " + err.Error())
			sleep(gctx, time.Second)
			continue
		}
		failing = false
		j.setStatus("")
		ro, ok := c.State().Rollout()
		if !ok {
			j.m.overdue.Set(0)
			continue
		}
		due := ro.Record.Rollout.EndsAt.Add(j.cfg.Settle)
		now := j.cfg.Now()
		if now.Before(due) {
			j.m.overdue.Set(0)
			sleep(gctx, min(due.Sub(now), time.Second))
			continue
		}
		j.m.overdue.Set(now.Sub(due).Seconds())
		if err := j.decide(gctx, c, ro); err != nil {
			if gctx.Err() != nil {
				return
			}
			j.errors()
			j.cfg.Logger.Warn("rollout judge: no verdict yet; retrying", "rollout", ro.Record.Revision, "err", err)
			j.setStatus(fmt.Sprintf("rollout judge: rollout %d: %v", ro.Record.Revision, err))
			sleep(gctx, time.Second)
		}
	}
}

// decide measures rollout ro and writes its verdict. A refusal because the
// rollout is no longer open (another judge decided, a push superseded it)
// is not an error: the log has its verdict.
func (j *Judge) decide(ctx context.Context, c *policylog.Client, ro policylog.OpenRollout) error {
	rev, bound := ro.Record.Revision, ro.Record.Rollout.MaxNewlyRejected
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	decisions, newly, err := j.cfg.Counter.Count(cctx, rev)
	cancel()
	if err != nil {
		return fmt.Errorf("read the rollout's counters: %w", err)
	}
	v := policylog.Verdict{Rollout: rev, Decisions: decisions, NewlyRejected: newly, MaxNewlyRejected: bound}
	if decisions > 0 {
		v.Share = float64(newly) / float64(decisions)
	}
	switch {
	case decisions == 0:
		v.Decision = policylog.Withdraw
		v.Reason = "no decision was evaluated under the candidate: nothing shows it is safe"
	case v.Share <= bound:
		v.Decision = policylog.Promote
		v.Reason = fmt.Sprintf("%s newly rejected (%d of %d decisions), within the bound of %s", policylog.FormatShare(v.Share), newly, decisions, policylog.FormatShare(bound))
	default:
		v.Decision = policylog.Withdraw
		v.Reason = fmt.Sprintf("%s newly rejected (%d of %d decisions), above the bound of %s", policylog.FormatShare(v.Share), newly, decisions, policylog.FormatShare(bound))
	}
	o, err := j.write(ctx, c, v)
	var ref *policylog.Refusal
	if errors.As(err, &ref) && v.Decision == policylog.Promote && o.Code == policylog.CodeInvalid {
		// The candidate can no longer be the document (an override added
		// meanwhile uses a tier it drops): withdraw, saying so.
		v.Decision = policylog.Withdraw
		v.Reason += "; but promoting was refused: " + o.Reason
		o, err = j.write(ctx, c, v)
	}
	if errors.As(err, &ref) && o.Code == policylog.CodeConflict {
		j.cfg.Logger.Info("rollout judge: the rollout was closed meanwhile (another judge, or a push); nothing to do", "rollout", rev, "reason", o.Reason)
		return nil
	}
	if err != nil {
		return err
	}
	j.m.share.Set(v.Share)
	j.m.overdue.Set(0)
	lvl := slog.LevelInfo
	if v.Decision == policylog.Withdraw {
		lvl = slog.LevelWarn
	}
	j.cfg.Logger.Log(ctx, lvl, "rollout judged", "rollout", rev, "verdict", v.Decision, "revision", o.Head,
		"decisions", decisions, "newly_rejected", newly, "share", v.Share, "bound", bound)
	return nil
}

func (j *Judge) write(ctx context.Context, c *policylog.Client, v policylog.Verdict) (policylog.Outcome, error) {
	msg := fmt.Sprintf("%s rollout %d: %s", v.Decision, v.Rollout, v.Reason)
	o, err := c.Decide(ctx, v, j.cfg.Name, msg)
	var ref *policylog.Refusal
	switch {
	case err == nil:
		j.m.verdicts.WithLabelValues(v.Decision, policylog.Applied).Inc()
	case errors.As(err, &ref):
		j.m.verdicts.WithLabelValues(v.Decision, policylog.Refused).Inc()
	}
	return o, err
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
