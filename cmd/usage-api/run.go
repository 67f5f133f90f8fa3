package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/internal/chconn"
	"github.com/ratewarden/ratewarden/internal/lifecycle"
	"github.com/ratewarden/ratewarden/internal/redisclient"
	"github.com/ratewarden/ratewarden/internal/tracing"
	"github.com/ratewarden/ratewarden/metering/usage"
	"github.com/ratewarden/ratewarden/schema"
)

// redisOptions tune the client of the quota view (GET /v1/quota).
var redisOptions = redisclient.Options{Timeout: time.Second, PoolSize: 16}

// run serves until ctx ends, under one lifecycle.Group: then the HTTP
// server drains in-flight requests, the schema loop and the SIGHUP reader
// stop, the spans flush and the connections close, in that order, within
// lifecycle.ShutdownGrace.
func run(ctx context.Context, cfg config, log *slog.Logger) error {
	conn, err := openClickHouse(cfg, cfg.ClickHouseAddr)
	if err != nil {
		return err
	}
	defer conn.Close()
	// OpenTelemetry, off unless an OTLP endpoint is set: a span per request
	// and per query made in a traced one (internal/tracing).
	tr, err := tracing.New(os.Getenv, "usage-api")
	if err != nil {
		return err
	}
	var g lifecycle.Group
	g.OnStop("tracing", func(ctx context.Context) error {
		if err := tr.Shutdown(ctx); err != nil { // the spans of the last requests
			log.Warn("flushing traces at shutdown", "err", err)
		}
		return nil
	})
	// A step below that fails releases what the group holds (the tracer);
	// the connections close in their defers.
	abort := func(err error) error { return g.Release(err, lifecycle.ShutdownGrace) }

	store, err := usage.NewStore(tr.ClickHouse(conn), cfg.Database)
	if err != nil {
		return abort(err)
	}
	signer, err := usage.NewSigner([]byte(cfg.TokenSecret))
	if err != nil {
		return abort(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var rdb redis.UniversalClient
	var onHUP []func() error // what SIGHUP re-reads: rotated secrets and certificates
	if cfg.Redis.Enabled() {
		conn, err := cfg.Redis.Open(redisOptions)
		if err != nil {
			return abort(err)
		}
		defer conn.Close()
		rdb = conn.UniversalClient
		onHUP = append(onHUP, conn.Reload)
	} else {
		log.Warn("REDIS_ADDRS is empty: the quota view shows the usage record only, not what the limiter's counters say is left")
	}
	named := map[string]*redisstore.Store{} // REDIS_STORES, for the support page
	for _, ns := range cfg.Stores {
		conn, err := ns.Redis.Open(redisOptions)
		if err != nil {
			return abort(fmt.Errorf("REDIS_STORES %s: %w", ns.Name, err))
		}
		defer conn.Close()
		named[ns.Name] = redisstore.New(conn.UniversalClient, ns.Redis.KeyPrefix)
		onHUP = append(onHUP, conn.Reload)
	}
	statements, billingStore, err := newStatements(tr.ClickHouse(conn), cfg.Database, cfg.PolicyFile, cfg.Billing.Grace, log) // billing.go
	if err != nil {
		return abort(err)
	}
	srv, err := usage.New(usage.Config{Store: store, Signer: signer, AdminToken: cfg.AdminToken,
		PolicyPath: cfg.PolicyFile, Logger: log, Registry: reg, QueryTimeout: cfg.QueryTimeout,
		Redis: rdb, KeyPrefix: cfg.Redis.KeyPrefix, Statement: statementFunc(statements)})
	if err != nil {
		return abort(err)
	}

	// The schema (our tables and the rollups) is applied in the background
	// until it succeeds: the API starts, and answers 503, while ClickHouse is
	// still down.
	if cfg.Cluster.Enabled() {
		// Cluster mode: the migrations in cluster form on every node; the
		// reads go through the Distributed tables of CLICKHOUSE_ADDR.
		shards := make([][]driver.Conn, len(cfg.Cluster.Shards))
		for i, shard := range cfg.Cluster.Shards {
			for _, addr := range shard {
				c, err := openClickHouse(cfg, addr)
				if err != nil {
					return abort(err)
				}
				defer c.Close()
				shards[i] = append(shards[i], c)
			}
		}
		g.Add("schema", func(ctx context.Context) error {
			schema.ApplyClusterUntilDone(ctx, shards, cfg.Database, cfg.Cluster.Name, log, nil)
			return nil
		})
	} else {
		g.Add("schema", func(ctx context.Context) error { schema.ApplyUntilDone(ctx, conn, cfg.Database, log); return nil })
	}

	handler, ops, closePolicyLog, err := withPolicyAPI(cfg, conn, srv.Handler(), log) // policyops.go
	if err != nil {
		return abort(err)
	}
	defer closePolicyLog()
	handler, closeBilling, err := withBilling(cfg, statements, billingStore, handler, log) // billing.go
	if err != nil {
		return abort(err)
	}
	defer closeBilling()
	handler, err = withSupport(cfg, conn, rdb, named, ops.Override, handler, log) // supportdesk.go
	if err != nil {
		return abort(err)
	}

	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return abort(fmt.Errorf("listen %s: %w", cfg.Addr, err))
	}
	hs := &http.Server{
		Handler:           tr.Handler("", handler),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      cfg.QueryTimeout + 20*time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	if cfg.ListenTLS != nil {
		hs.TLSConfig = cfg.ListenTLS.Config()
		onHUP = append(onHUP, cfg.ListenTLS.Reload)
	}
	g.Add("sighup", newHUPReader(onHUP, log).Run)
	g.HTTPServer("http", hs, ln)
	g.OnStop("log", func(context.Context) error { log.Info("shutting down"); return nil })
	log.Info("usage-api listening", "addr", ln.Addr().String(), "tls", cfg.ListenTLS != nil, "clickhouse", cfg.ClickHouse.Describe(), "database", cfg.Database, "policy_file", cfg.PolicyFile,
		"cluster", cfg.Cluster.Name)
	if err := g.Run(ctx, lifecycle.ShutdownGrace); err != nil {
		return err
	}
	log.Info("stopped")
	return nil
}

// openClickHouse opens a native-protocol connection to addr with the
// binary's credentials and TLS (internal/chconn, the one place the options
// are built); its Ping explains a refused login or certificate.
func openClickHouse(cfg config, addr string) (driver.Conn, error) {
	return cfg.ClickHouse.At(addr).Open(chconn.Tuning{DialTimeout: 3 * time.Second, ReadTimeout: cfg.QueryTimeout + 5*time.Second, MaxOpenConns: 16})
}

// hupReader runs every reload on SIGHUP (the Redis password file and TLS
// files, the listener's certificate), logging each failure (which names the
// variable or file, never a secret; what was in force stays).
type hupReader struct {
	hup     chan os.Signal
	reloads []func() error
	log     *slog.Logger
}

// newHUPReader registers for SIGHUP at once (no goroutine): without it a
// SIGHUP would end the process. Run reads it.
func newHUPReader(reloads []func() error, log *slog.Logger) *hupReader {
	h := &hupReader{hup: make(chan os.Signal, 1), reloads: reloads, log: log}
	signal.Notify(h.hup, syscall.SIGHUP)
	return h
}

// Run reloads on every SIGHUP until ctx ends, then stops listening.
func (h *hupReader) Run(ctx context.Context) error {
	defer signal.Stop(h.hup)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-h.hup:
			for _, reload := range h.reloads {
				if err := reload(); err != nil {
					h.log.Error("re-reading on SIGHUP failed; the previous ones stay in force", "err", err)
				}
			}
			h.log.Info("re-read secrets and certificates on SIGHUP", "count", len(h.reloads))
		}
	}
}
