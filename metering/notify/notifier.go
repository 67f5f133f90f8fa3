// Package notify is the soft-limit notifier: a consumer group of its own
// ("notifier") on the decisions topic that sends a signed webhook when a
// key's decisions cross its soft limit (events with warning = true), at most
// once per key and scope per cool-down, retried with exponential backoff and
// jitter, every attempt recorded in ClickHouse (webhook_deliveries).
//
// # Design
//
// One goroutine (Run) reads the topic and decides; it never waits on a
// receiver. A notification becomes a delivery goroutine, bounded by
// MaxInFlight (when all slots are busy the notification is dropped and
// counted, so a hanging receiver can slow nothing but its own deliveries).
// Being a separate consumer group, the notifier and the meter consumer
// ("meter") never wait on each other: each has its own offsets.
//
// The cool-down is judged by event time (ts), so a replayed event is
// suppressed like the original; at start the cool-downs of the last period
// are restored from webhook_deliveries, so a restart does not repeat a
// notification. Offsets are committed once the event is decided; a delivery
// still retrying at shutdown gets ShutdownGrace to finish and is then
// recorded as abandoned (webhooks are at-most-once across a restart within a
// cool-down, and each is retried up to the schedule's bound).
//
// Reading is a consumer group whose committed offsets are checked before
// they are used (epoch.go, group.go): a log that started over (a recreated
// topic, another cluster, a fresh broker) is read from its start, never
// skipped from an old offset.
//
// Recording is asynchronous (recorder): a ClickHouse outage delays the
// records, never a delivery.
package notify

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"

	"github.com/ratewarden/ratewarden/internal/kafkaconn"
	"github.com/ratewarden/ratewarden/internal/lifecycle"
	"github.com/ratewarden/ratewarden/internal/promdecl"
	"github.com/ratewarden/ratewarden/metering"
)

// EventType is the "type" of a soft-limit webhook body.
const EventType = "ratelimit.soft_limit.crossed"

// DefaultCooldown is how long a key and scope, once notified, are not
// notified again (WEBHOOK_COOLDOWN).
const DefaultCooldown = time.Hour

// Config configures a Notifier. Zero values take the documented defaults.
type Config struct {
	Brokers []string // required
	Topic   string   // default metering.DefaultTopic
	GroupID string   // default "notifier"
	// TLS and SASL say how to reach the brokers (internal/kafkaconn builds
	// them from the environment); nil = plaintext, no authentication.
	TLS  *tls.Config
	SASL sasl.Mechanism

	// URL is the default endpoint (WEBHOOK_URL); "" = only keys listed in
	// EndpointsFile are notified. Secret ("whsec_<base64>", WEBHOOK_SECRET)
	// is required with URL.
	URL    string
	Secret string
	// EndpointsFile lists per-key endpoints (see endpointsFile); "" = none.
	// It is re-read every ReloadEvery (default 2 s) when it changed.
	EndpointsFile string
	ReloadEvery   time.Duration

	Cooldown       time.Duration // per key and scope, default DefaultCooldown
	MaxEventAge    time.Duration // older warnings are not notified; default = Cooldown
	Retry          Schedule      // zero = DefaultSchedule
	AttemptTimeout time.Duration // one HTTP attempt, default 10 s
	MaxInFlight    int           // concurrent deliveries, default 256
	ShutdownGrace  time.Duration // for in-flight deliveries at shutdown, default 2 s
	SessionTimeout time.Duration // consumer-group session, default kafkaconn.GroupSessionTimeout
	RecordEvery    time.Duration // flush interval of attempt records, default 500 ms

	Conn     driver.Conn // required: attempts are recorded here
	Database string      // required

	Logger   *slog.Logger          // required
	Registry prometheus.Registerer // required
	Now      func() time.Time      // default time.Now
	Jitter   func() float64        // in [0, 1); default math/rand/v2
	Client   *http.Client          // default: no redirects, AttemptTimeout
}

// Notifier is the soft-limit notifier. Create it with New and run it with
// Run; it is not restartable.
type Notifier struct {
	cfg Config
	log *slog.Logger
	m   *metrics
	eps *endpoints
	rec *recorder
	sem chan struct{}
	wg  sync.WaitGroup

	last map[string]int64 // key\x00scope → event ms of the last notification; owned by Run

	running atomic.Bool
}

// Ready reports whether the notifier is running and can record its
// attempts, and why not. Safe for concurrent use.
func (n *Notifier) Ready() (bool, string) {
	if !n.running.Load() {
		return false, "notifier not running"
	}
	if msg, _ := n.rec.failing.Load().(string); msg != "" {
		return false, "recording webhook attempts in ClickHouse fails: " + msg
	}
	return true, ""
}

// New validates cfg and registers the metrics.
func New(cfg Config) (*Notifier, error) {
	var errs []error
	if len(cfg.Brokers) == 0 {
		errs = append(errs, errors.New("no Kafka brokers"))
	}
	if cfg.Conn == nil || cfg.Database == "" || cfg.Logger == nil || cfg.Registry == nil {
		errs = append(errs, errors.New("Conn, Database, Logger and Registry are required"))
	}
	var def Endpoint
	if cfg.URL != "" {
		if err := CheckURL(cfg.URL); err != nil {
			errs = append(errs, fmt.Errorf("URL: %w", err))
		}
		def.URL = cfg.URL
	}
	if cfg.Secret != "" {
		k, err := ParseSecret(cfg.Secret)
		if err != nil {
			errs = append(errs, err)
		}
		def.Key = k
	} else if cfg.URL != "" {
		errs = append(errs, errors.New("Secret is required with URL"))
	}
	if cfg.URL == "" && cfg.EndpointsFile == "" {
		errs = append(errs, errors.New("neither URL nor EndpointsFile: nothing to notify"))
	}
	cfg.Retry = cfg.Retry.orDefault()
	if err := cfg.Retry.validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("notify: %w", err)
	}
	if cfg.Topic == "" {
		cfg.Topic = metering.DefaultTopic
	}
	if cfg.GroupID == "" {
		cfg.GroupID = "notifier"
	}
	if cfg.ReloadEvery <= 0 {
		cfg.ReloadEvery = 2 * time.Second
	}
	if cfg.Cooldown <= 0 {
		cfg.Cooldown = DefaultCooldown
	}
	if cfg.MaxEventAge <= 0 {
		cfg.MaxEventAge = cfg.Cooldown
	}
	if cfg.AttemptTimeout <= 0 {
		cfg.AttemptTimeout = 10 * time.Second
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 256
	}
	if cfg.ShutdownGrace <= 0 {
		cfg.ShutdownGrace = 2 * time.Second
	}
	if cfg.SessionTimeout <= 0 {
		cfg.SessionTimeout = kafkaconn.GroupSessionTimeout
	}
	if cfg.RecordEvery <= 0 {
		cfg.RecordEvery = 500 * time.Millisecond
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Jitter == nil {
		cfg.Jitter = rand.Float64
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{
			Timeout:       cfg.AttemptTimeout,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	m, err := newMetrics(cfg.Registry)
	if err != nil {
		return nil, fmt.Errorf("notify: metrics: %w", err)
	}
	n := &Notifier{cfg: cfg, log: cfg.Logger, m: m, sem: make(chan struct{}, cfg.MaxInFlight), last: map[string]int64{}}
	n.eps = &endpoints{def: def, path: cfg.EndpointsFile, log: cfg.Logger}
	if err := n.eps.reload(); err != nil {
		return nil, fmt.Errorf("notify: %w", err)
	}
	n.rec = &recorder{conn: cfg.Conn, db: cfg.Database, log: cfg.Logger, in: make(chan Attempt, 4096),
		every: cfg.RecordEvery, dropped: func() { m.recordsDropped.Inc() }}
	return n, nil
}

func pairKey(key, scope string) string { return key + "\x00" + scope }

// Run consumes until ctx ends, then stops reading (the reader's fetch in
// flight ends within 5 s) while in-flight deliveries get ShutdownGrace,
// flushes the attempt records (at most 2 s more) and returns nil.
func (n *Notifier) Run(ctx context.Context) error {
	recCtx, stopRec := context.WithCancel(context.Background())
	var bg sync.WaitGroup
	bg.Add(2)
	go func() { defer bg.Done(); n.rec.run(recCtx) }()
	go func() { defer bg.Done(); n.reloadLoop(ctx) }()

	deliverCtx, stopDeliveries := context.WithCancel(context.Background())
	n.restoreCooldowns(ctx)
	gc := kafkaconn.GroupConfig(n.cfg.GroupID, n.cfg.Brokers, n.cfg.Topic,
		&kafka.Dialer{ClientID: "notifier", Timeout: 10 * time.Second, DualStack: true, TLS: n.cfg.TLS, SASLMechanism: n.cfg.SASL},
		n.cfg.SessionTimeout)
	// A member told to rejoin first ends its fetches and commits what it
	// decided (revokeBudget); the coordinator drops a member that has not
	// rejoined within the rebalance timeout and hands its partitions to
	// another, which reads the events again.
	gc.RebalanceTimeout = n.cfg.SessionTimeout + revokeBudget
	gc.StartOffset = kafka.FirstOffset
	gc.WatchPartitionChanges, gc.PartitionWatchInterval = true, 10*time.Second
	group, err := kafka.NewConsumerGroup(gc)
	if err != nil {
		stopDeliveries()
		stopRec()
		bg.Wait()
		return fmt.Errorf("notify: group %s: %w", n.cfg.GroupID, err)
	}
	n.running.Store(true)
	defer n.running.Store(false)
	n.log.Info("notifier started", "group", n.cfg.GroupID, "topic", n.cfg.Topic, "cooldown", n.cfg.Cooldown.String())
	for {
		gen, err := group.Next(ctx)
		if ctx.Err() != nil {
			break
		}
		if err != nil {
			n.kafkaError(fmt.Errorf("consumer group: %w", err))
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		n.runGeneration(ctx, deliverCtx, gen)
	}
	// Closing the group waits for the generation's goroutines (their
	// fetches end with ctx) and leaves the group: it runs while the
	// deliveries get their grace.
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		if err := group.Close(); err != nil {
			n.log.Warn("notifier: leave group", "err", err)
		}
	}()
	done := make(chan struct{})
	go func() { n.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(n.cfg.ShutdownGrace):
		stopDeliveries()
		<-done
	}
	stopDeliveries()
	<-closed
	stopRec()
	bg.Wait()
	n.log.Info("notifier stopped")
	return nil
}

// Reading the topic. kafka-go's Reader uses MaxWait as the socket deadline
// of the whole fetch (segmentio/kafka-go#574): the broker is asked to wait
// for data MaxWait less 1 s (a quarter below 1 s), and the answer must have
// arrived by MaxWait. With the 500 ms and 10 MiB per fetch this had, a
// catch-up fetch on a loaded machine (a large answer the broker or the
// machine cannot deliver within 500 ms) timed out on every try, at the same
// offset, told only to the unset ErrorLogger: the meter consumer stalled
// exactly so (metering/consumer/fetch.go). Here a fetch with data
// to return has readerMaxWait to arrive, an idle one 1 s beyond the
// broker's wait (missing that is a logged, counted retry, not a stall: the
// next fetch finds the data), answers are at most readerMaxBytes, and every
// error the Reader reports is logged and counted (notifier_kafka_errors_total).
const (
	readerMaxWait      = 5 * time.Second
	readerMaxBytes     = 1 << 20
	readerBatchTimeout = 10 * time.Second // reading one message of an answer (kafka-go's default)
	// revokeBudget is the longest a member takes to let its partitions go
	// at a rebalance: its readers end their fetch in flight (readerMaxWait,
	// or readerBatchTimeout inside an answer) and its last offsets are
	// committed (kafka-go: 3 tries of up to 5 s each, 0.5 s of backoff).
	revokeBudget = readerBatchTimeout + 3*5*time.Second + time.Second
)

func (n *Notifier) reloadLoop(ctx context.Context) {
	if n.cfg.EndpointsFile == "" {
		return
	}
	lifecycle.Every(ctx, n.cfg.ReloadEvery, func(context.Context) {
		if err := n.eps.reload(); err != nil {
			n.m.reloadErrors.Inc()
			n.log.Warn("webhook endpoints file refused; keeping the previous one", "path", n.cfg.EndpointsFile, "err", err)
		}
	})
}

// restoreCooldowns loads the notifications of the last cool-down period.
// If ClickHouse cannot be read (3 tries), the notifier starts without them.
func (n *Notifier) restoreCooldowns(ctx context.Context) {
	for try := 1; try <= 3; try++ {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		recent, err := recentDeliveries(qctx, n.cfg.Conn, n.cfg.Database, n.cfg.Now().Add(-n.cfg.Cooldown-n.cfg.MaxEventAge))
		cancel()
		if err == nil {
			for k, ts := range recent {
				n.last[k] = ts
			}
			return
		}
		n.log.Warn("notifier: restore cool-downs", "try", try, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// handle decides whether ev starts a notification. Called by Run only.
func (n *Notifier) handle(ctx context.Context, ev metering.Event) {
	if !ev.Warning {
		return
	}
	now := n.cfg.Now()
	if now.Sub(time.UnixMilli(ev.TS)) > n.cfg.MaxEventAge {
		n.m.notifications.WithLabelValues("stale").Inc()
		return
	}
	k := pairKey(ev.Key, ev.Scope)
	if last, ok := n.last[k]; ok && ev.TS < last+n.cfg.Cooldown.Milliseconds() {
		n.m.notifications.WithLabelValues("suppressed").Inc()
		return
	}
	ep, ok := n.eps.lookup(ev.Key)
	if !ok {
		n.m.notifications.WithLabelValues("no_endpoint").Inc()
		return
	}
	select {
	case n.sem <- struct{}{}:
	default:
		n.m.notifications.WithLabelValues("dropped").Inc()
		n.log.Warn("notification dropped: every delivery slot is busy", "key", ev.Key, "scope", ev.Scope)
		return
	}
	if len(n.last) > 100_000 {
		cut := now.Add(-n.cfg.Cooldown - n.cfg.MaxEventAge).UnixMilli()
		for key, ts := range n.last {
			if ts < cut {
				delete(n.last, key)
			}
		}
	}
	n.last[k] = ev.TS
	n.m.notifications.WithLabelValues("sent").Inc()
	body, err := json.Marshal(payload(ev))
	if err != nil { // cannot happen: plain strings and numbers
		<-n.sem
		n.log.Error("encode webhook", "err", err)
		return
	}
	n.wg.Add(1)
	n.m.inFlight.Inc()
	go func() {
		defer n.wg.Done()
		defer n.m.inFlight.Dec()
		defer func() { <-n.sem }()
		n.deliver(ctx, ep, ev, body)
	}()
}

type webhookBody struct {
	Type      string      `json:"type"`
	Timestamp string      `json:"timestamp"`
	Data      webhookData `json:"data"`
}

type webhookData struct {
	Key         string  `json:"key"`
	Scope       string  `json:"scope"`
	Tier        string  `json:"tier"`
	Limit       int64   `json:"limit"`
	Remaining   int64   `json:"remaining"`
	PercentUsed float64 `json:"percentUsed"`
	Policy      string  `json:"policy"`
	EventID     string  `json:"eventId"`
}

func payload(ev metering.Event) webhookBody {
	pct := 0.0
	if ev.Limit > 0 {
		used := ev.Limit - max(ev.Remaining, 0)
		pct = math.Round(float64(used)*1000/float64(ev.Limit)) / 10
	}
	return webhookBody{Type: EventType, Timestamp: time.UnixMilli(ev.TS).UTC().Format(time.RFC3339Nano),
		Data: webhookData{Key: ev.Key, Scope: ev.Scope, Tier: ev.Tier, Limit: ev.Limit, Remaining: ev.Remaining,
			PercentUsed: pct, Policy: ev.Policy, EventID: ev.EventID}}
}

// deliver makes up to Retry.Attempts attempts, recording each.
func (n *Notifier) deliver(ctx context.Context, ep Endpoint, ev metering.Event, body []byte) {
	id := "msg_" + ev.EventID
	rec := Attempt{DeliveryID: id, Key: ev.Key, Scope: ev.Scope, Tier: ev.Tier, URL: redact(ep.URL),
		EventID: ev.EventID, EventTS: uint64(ev.TS)}
	for attempt := 1; ; attempt++ {
		a := rec
		a.Attempt = uint16(attempt)
		a.AttemptedAt = n.cfg.Now()
		start := time.Now()
		status, err := n.post(ctx, ep, id, body)
		a.DurationMs = uint32(time.Since(start).Milliseconds())
		a.StatusCode = uint16(status)
		last := attempt >= n.cfg.Retry.Attempts
		switch {
		case err == nil:
			a.Outcome = "delivered"
		case ctx.Err() != nil:
			a.Outcome, a.Error = "abandoned", "shutdown: "+err.Error()
		case last:
			a.Outcome, a.Error = "failed", err.Error()
		default:
			a.Outcome, a.Error = "retrying", err.Error()
		}
		n.m.attempts.WithLabelValues(a.Outcome).Inc()
		n.rec.record(a)
		if a.Outcome != "retrying" {
			if a.Outcome != "delivered" {
				n.log.Warn("webhook not delivered", "delivery_id", id, "key", ev.Key, "scope", ev.Scope, "attempts", attempt, "outcome", a.Outcome, "err", a.Error)
			}
			return
		}
		wait := n.cfg.Retry.Wait(attempt, n.cfg.Jitter())
		select {
		case <-ctx.Done():
			a := rec
			a.Attempt, a.AttemptedAt, a.Outcome, a.Error = uint16(attempt+1), n.cfg.Now(), "abandoned", "shutdown before the next attempt"
			n.m.attempts.WithLabelValues(a.Outcome).Inc()
			n.rec.record(a)
			return
		case <-time.After(wait):
		}
	}
}

// post makes one attempt; success is a 2xx answer.
func (n *Notifier) post(ctx context.Context, ep Endpoint, id string, body []byte) (int, error) {
	actx, cancel := context.WithTimeout(ctx, n.cfg.AttemptTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(actx, http.MethodPost, ep.URL, bytes.NewReader(body))
	if err != nil {
		return 0, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "ratewarden-notifier/1")
	SetHeaders(req.Header, ep.Key, id, n.cfg.Now(), body)
	resp, err := n.cfg.Client.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, fmt.Errorf("receiver answered %d", resp.StatusCode)
	}
	return resp.StatusCode, nil
}

// redact drops user info and query from a URL before it is recorded.
func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return ""
	}
	u.User, u.RawQuery, u.Fragment = nil, "", ""
	return u.String()
}

type metrics struct {
	events, badEvents, recordsDropped, reloadErrors prometheus.Counter
	kafkaErrors, epochs                             prometheus.Counter
	notifications, attempts                         *prometheus.CounterVec
	inFlight                                        prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		events:         promdecl.Counter("notifier_events_total", "Decision events read by the notifier."),
		badEvents:      promdecl.Counter("notifier_bad_events_total", "Messages that are not decodable decision events."),
		recordsDropped: promdecl.Counter("notifier_attempt_records_dropped_total", "Delivery attempts that could not be recorded in ClickHouse."),
		reloadErrors:   promdecl.Counter("notifier_endpoints_reload_errors_total", "Refused versions of the per-key endpoints file."),
		kafkaErrors:    promdecl.Counter("notifier_kafka_errors_total", "Errors of the notifier's Kafka reader (failed or timed-out fetches, group and commit errors), each retried and logged at WARN; rising while notifier_events_total stays flat is a stalled notifier."),
		epochs:         promdecl.Counter("notifier_log_epochs_total", "Partition logs the notifier found had started over (a recreated topic, another cluster, a fresh broker) and read from their start."),
		notifications:  promdecl.CounterVec("notifier_notifications_total", "Warning events by decision: sent, suppressed (cool-down), stale, no_endpoint, dropped (no delivery slot).", "result"),
		attempts:       promdecl.CounterVec("notifier_attempts_total", "Webhook delivery attempts by outcome: delivered, retrying, failed, abandoned.", "outcome"),
		inFlight:       promdecl.Gauge("notifier_deliveries_in_flight", "Deliveries being attempted or waiting for a retry."),
	}
	for _, c := range []prometheus.Collector{m.events, m.badEvents, m.recordsDropped, m.reloadErrors, m.kafkaErrors, m.epochs, m.notifications, m.attempts, m.inFlight} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
