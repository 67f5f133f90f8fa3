package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/internal/kafkaconn"
	"github.com/ratewarden/ratewarden/internal/lifecycle"
	"github.com/ratewarden/ratewarden/internal/redisclient"
	"github.com/ratewarden/ratewarden/internal/tracing"
	"github.com/ratewarden/ratewarden/metering/consumer"
	"github.com/ratewarden/ratewarden/metering/notify"
	"github.com/ratewarden/ratewarden/metering/quotause"
	"github.com/ratewarden/ratewarden/metering/reconcile"
	"github.com/ratewarden/ratewarden/policy"
)

// component is one long-running part of the binary: Run blocks until ctx
// is cancelled, then finishes its work (within the shutdown budget) and
// returns; Ready says whether it can do its job now.
type component struct {
	name  string
	run   func(ctx context.Context) error
	ready func() (bool, string)
}

// run builds the components, serves health and metrics, and runs them
// under one lifecycle.Group until ctx ends (SIGTERM/SIGINT) or one fails;
// then they stop in reverse order within lifecycle.ShutdownGrace, the
// health server and the ClickHouse connections last.
func run(ctx context.Context, cfg config, log *slog.Logger) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	conn, err := openClickHouse(cfg, cfg.ClickHouseAddr)
	if err != nil {
		return err
	}
	defer conn.Close()
	// OpenTelemetry, off unless an OTLP endpoint is set: a span per batch
	// written, with its INSERTs (tracing.go).
	tr, err := tracing.New(os.Getenv, "meter-consumer")
	if err != nil {
		return err
	}
	var g lifecycle.Group
	g.OnStop("tracing", func(ctx context.Context) error {
		if err := tr.Shutdown(ctx); err != nil { // the last batches' spans
			log.Warn("flushing traces at shutdown", "err", err)
		}
		return nil
	})
	// A step below that fails releases what the group holds (the tracer,
	// the reconciler's Redis client); the ClickHouse connections close in
	// their defers.
	abort := func(err error) error { return g.Release(err, lifecycle.ShutdownGrace) }
	conn = tr.ClickHouse(conn)
	store, err := buildStore(cfg, conn, log)
	if err != nil {
		return abort(err)
	}
	defer store.close()

	schema := schemaGate(make(chan struct{}))
	schemaComp := component{
		name: "schema",
		run: func(ctx context.Context) error {
			store.applySchema(ctx, sync.OnceFunc(func() { close(schema) }))
			<-ctx.Done()
			return nil
		},
		ready: func() (bool, string) {
			if !schema.applied() {
				return false, "schema not applied yet (waiting for ClickHouse)"
			}
			return true, ""
		},
	}

	obs, err := consumer.InsertMetrics(reg)
	if err != nil {
		return abort(err)
	}
	sink, err := store.sink(obs)
	if err != nil {
		return abort(err)
	}
	meter, err := consumer.New(consumer.Config{
		Brokers:        cfg.KafkaBrokers,
		Topic:          cfg.KafkaTopic,
		GroupID:        "meter",
		Sink:           tracedConsumerSink(tr, sink),
		Ping:           store.ping,
		BatchSize:      cfg.BatchSize,
		BatchWait:      cfg.BatchWait,
		DedupWindow:    cfg.DedupWindow,
		SessionTimeout: cfg.SessionTimeout,
		StallAfter:     cfg.StallAfter,
		TLS:            cfg.Kafka.TLS,
		SASL:           cfg.Kafka.SASL,
		Logger:         log.With("component", "meter"),
		Registry:       reg,
	})
	if err != nil {
		return abort(err)
	}
	meterComp := component{
		name: "meter",
		run: func(ctx context.Context) error {
			if !schema.wait(ctx) { // the tables must exist before the first batch
				return nil
			}
			return meter.Run(ctx)
		},
		ready: meter.Ready,
	}

	// The connection check: a broker that refuses the credential or the
	// certificate is named in /readyz and counted, not left to the
	// consumer group's silent retries (internal/kafkaconn).
	for _, w := range cfg.Kafka.Warnings() {
		log.Warn(w)
	}
	checker, err := kafkaconn.NewChecker(kafkaconn.CheckerConfig{
		Brokers: cfg.KafkaBrokers, Security: cfg.Kafka, ClientID: "meter-consumer",
		Every: cfg.KafkaCheckEvery, Logger: log.With("component", "kafka"), Registry: reg,
	})
	if err != nil {
		return abort(err)
	}
	kafkaComp := component{
		name:  "kafka",
		run:   func(ctx context.Context) error { checker.Run(ctx); return nil },
		ready: checker.Ready,
	}

	components := []component{clickhouseComponent(conn, log), schemaComp, kafkaComp, meterComp}
	audit, err := policyAuditComponent(cfg, conn, schema, reg, log) // policy_audit (policylog.go)
	if err != nil {
		return abort(err)
	}
	components = append(components, audit)
	if j, err := judgeComponent(cfg, conn, schema, reg, log); err != nil { // the rollout judge (policylog.go)
		return abort(err)
	} else if j != nil {
		components = append(components, *j)
	}
	// The soft-limit notifier: its own consumer group ("notifier"), so a slow
	// webhook receiver never delays metering (metering/notify).
	if cfg.WebhookURL != "" {
		notifier, err := notify.New(notify.Config{
			Brokers: cfg.KafkaBrokers, Topic: cfg.KafkaTopic, GroupID: "notifier", TLS: cfg.Kafka.TLS, SASL: cfg.Kafka.SASL,
			URL: cfg.WebhookURL, Secret: cfg.WebhookSecret, EndpointsFile: cfg.WebhookFile, Cooldown: cfg.WebhookCooldown,
			SessionTimeout: cfg.SessionTimeout, Conn: conn, Database: cfg.Database,
			Logger: log.With("component", "notifier"), Registry: reg,
		})
		if err != nil {
			return abort(err)
		}
		components = append(components, component{
			name: "notifier",
			run: func(ctx context.Context) error {
				if !schema.wait(ctx) { // webhook_deliveries must exist
					return nil
				}
				return notifier.Run(ctx)
			},
			ready: notifier.Ready,
		})
	}

	if cfg.Redis.Enabled() {
		rc, err := buildReconciler(&g, cfg, conn, schema, reg, log)
		if err != nil {
			return abort(err)
		}
		components = append(components, rc)
	}

	ln, err := net.Listen("tcp", cfg.MeterAddr)
	if err != nil {
		return abort(fmt.Errorf("METER_ADDR %s: %w", cfg.MeterAddr, err))
	}
	// The health server stops after the components: /readyz answers while
	// they finish.
	srv := &http.Server{Handler: healthMux(reg, components), ReadHeaderTimeout: 5 * time.Second}
	g.Server("health server", func() error {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("health server", "err", err)
		}
		return nil
	}, func(ctx context.Context) error { _ = srv.Shutdown(ctx); return nil })
	log.Info("meter-consumer started", "addr", ln.Addr().String(), "kafka", cfg.KafkaBrokers, "kafka_security", cfg.Kafka.Describe(), "topic", cfg.KafkaTopic,
		"clickhouse", cfg.ClickHouse.Describe(), "database", cfg.Database, "cluster", cfg.Cluster.Name, "shards", len(cfg.Cluster.Shards))

	for _, c := range components {
		g.Add(c.name, func(ctx context.Context) error {
			err := c.run(ctx)
			if err != nil && ctx.Err() != nil {
				// What fails while stopping is logged; only a failure
				// that ends the run is the binary's error.
				log.Warn("stopping", "component", c.name, "err", err)
				return nil
			}
			return err
		})
	}
	g.OnStop("log", func(context.Context) error { log.Info("meter-consumer stopping"); return nil })
	if err := g.Run(ctx, lifecycle.ShutdownGrace); err != nil {
		return err
	}
	log.Info("meter-consumer stopped")
	return nil
}

// clickhouseComponent pings ClickHouse every 2 s from the start (the
// consumer's own ping runs only once the schema is applied), so that a
// refused login or certificate is a readiness reason that says what to fix
// (internal/chconn explains it) and an error line when it starts.
func clickhouseComponent(conn driver.Conn, log *slog.Logger) component {
	var why atomic.Pointer[string]
	pending := "not checked yet"
	why.Store(&pending)
	return component{
		name: "clickhouse",
		run: func(ctx context.Context) error {
			ping := func(ctx context.Context) {
				pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				err := conn.Ping(pctx)
				cancel()
				if ctx.Err() != nil {
					return
				}
				prev := why.Load()
				if err == nil {
					why.Store(nil)
				} else if msg := err.Error(); prev == nil || *prev != msg {
					why.Store(&msg)
					log.Error("clickhouse: ping failed", "err", err)
				}
			}
			ping(ctx)
			lifecycle.Every(ctx, 2*time.Second, ping)
			return nil
		},
		ready: func() (bool, string) {
			if w := why.Load(); w != nil {
				return false, *w
			}
			return true, ""
		},
	}
}

func healthMux(reg *prometheus.Registry, components []component) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"ok"}` + "\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		reasons := map[string]string{}
		for _, c := range components {
			if ok, why := c.ready(); !ok {
				reasons[c.name] = why
			}
		}
		if len(reasons) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			_ = json.NewEncoder(w).Encode(map[string]any{"status": "not ready", "reasons": reasons})
			return
		}
		_, _ = w.Write([]byte(`{"status":"ready"}` + "\n"))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return mux
}

// redisOptions tune the quota reconciler's Redis client.
var redisOptions = redisclient.Options{Timeout: 2 * time.Second, PoolSize: 16}

// buildReconciler is the quota reconciler (metering/reconcile): every
// METER_RECONCILE_EVERY it raises the limiters' quota counters in Redis to
// what the rollups record, so that a Redis that lost its state does not hand
// out a fresh allowance. It waits for the schema like the others.
// Its Redis client is closed by g, after the component has stopped (or on
// a start that fails).
func buildReconciler(g *lifecycle.Group, cfg config, conn driver.Conn, schema schemaGate, reg *prometheus.Registry, log *slog.Logger) (component, error) {
	rlog := log.With("component", "reconciler")
	rc, err := cfg.Redis.Open(redisOptions)
	if err != nil {
		return component{}, err
	}
	g.OnStop("reconciler redis client", func(context.Context) error { return rc.Close() })
	rdb := rc.UniversalClient
	var home redis.UniversalClient // global quotas' counters, across regions
	if cfg.ReconcileRegion != "" && cfg.GlobalRedis.Enabled() {
		hc, err := cfg.GlobalRedis.Open(redisOptions)
		if err != nil {
			return component{}, err
		}
		g.OnStop("reconciler home redis client", func(context.Context) error { return hc.Close() })
		home = hc.UniversalClient
	}
	reader, err := quotause.NewReader(conn, cfg.Database)
	if err != nil {
		return component{}, err
	}
	pol := policy.NewCurrent(cfg.PolicyFile, func(err error) {
		rlog.Warn("policy file refused; reconciling with the previous one", "path", cfg.PolicyFile, "err", err)
	})
	if _, err := pol.Get(); err != nil {
		return component{}, lifecycle.Invalid(fmt.Errorf("POLICY_FILE: %w", err)) // exit 2, as for a variable
	}
	rec, err := reconcile.New(reconcile.Config{
		Redis: rdb, KeyPrefix: cfg.Redis.KeyPrefix, Rows: reader, Policy: pol.Get, Region: cfg.ReconcileRegion,
		GlobalRedis: home, GlobalKeyPrefix: cfg.GlobalRedis.KeyPrefix,
		Every: cfg.ReconcileEvery, Logger: rlog, Registry: reg,
	})
	if err != nil {
		return component{}, err
	}
	log.Info("quota reconciler on", "redis", cfg.Redis.Addrs, "redis_kind", rc.Kind(), "redis_tls", cfg.Redis.TLS, "every", cfg.ReconcileEvery.String(), "policy", cfg.PolicyFile, "region", cfg.ReconcileRegion)
	return component{
		name: "reconciler",
		run: func(ctx context.Context) error {
			if !schema.wait(ctx) { // the rollups must exist
				return nil
			}
			return rec.Run(ctx)
		},
		ready: rec.Ready,
	}, nil
}

// schemaGate is closed once the schema is applied: every component that
// reads or writes the tables waits for it before its first query.
type schemaGate chan struct{}

// wait returns true once the schema is applied, false if ctx ends first.
func (g schemaGate) wait(ctx context.Context) bool {
	select {
	case <-g:
		return true
	case <-ctx.Done():
		return false
	}
}

func (g schemaGate) applied() bool {
	select {
	case <-g:
		return true
	default:
		return false
	}
}
