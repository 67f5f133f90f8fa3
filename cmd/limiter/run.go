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
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/guard"
	"github.com/ratewarden/ratewarden/enforcement/httpapi"
	"github.com/ratewarden/ratewarden/enforcement/limitmetrics"
	"github.com/ratewarden/ratewarden/enforcement/policy"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
)

// run builds the limiter from cfg, serves until ctx ends, then shuts down
// in reverse order within the grace period.
func run(ctx context.Context, cfg config, log *slog.Logger) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := limitmetrics.New(reg)

	pol, err := policy.Load(cfg.PolicyFile)
	if err != nil {
		return err
	}

	authority, store, closeStore, err := buildAuthority(ctx, cfg, metrics, log)
	if err != nil {
		return err
	}
	defer closeStore()

	rec, closeRecorder, err := buildRecorder(cfg, reg, log)
	if err != nil {
		return err
	}

	lim, err := enforcement.New(enforcement.Config{
		Authority:         authority,
		Policy:            pol,
		ExpectedInstances: cfg.ExpectedInstances,
		LocalHeadroom:     cfg.LocalHeadroom,
		DegradedCeiling:   enforcement.Limit{Rate: cfg.DegradedRate, Burst: cfg.DegradedBurst},
		MaxKeys:           cfg.MaxKeys,
		Observer:          metrics,
		Recorder:          rec,
	})
	if err != nil {
		return err
	}

	reloader := newPolicyReloader(cfg.PolicyFile, lim, reg, log)
	reloader.set(pol)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	reloadCtx, stopReload := context.WithCancel(ctx)
	defer stopReload()
	reloadDone := make(chan struct{})
	go func() {
		defer close(reloadDone)
		reloader.run(reloadCtx, hup)
	}()

	mux := http.NewServeMux()
	mux.Handle("POST /check", httpapi.NewCheckHandler(lim, cfg.AuthToken, log))
	mux.Handle("/check", httpapi.NewCheckHandler(lim, cfg.AuthToken, log)) // 405 for other methods
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, readiness(store, reloader.current()))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))

	srv := &http.Server{
		Addr:              cfg.Addr,
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen on LIMITER_ADDR %s: %w", cfg.Addr, err)
	}
	log.Info("limiter listening", "addr", ln.Addr().String(), "store", store.kind,
		"expected_instances", cfg.ExpectedInstances, "policy", cfg.PolicyFile, "instance", cfg.InstanceID)
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()

	select {
	case err := <-serveErr:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down")
	shutCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownGrace)
	defer cancel()
	// Reverse order: stop taking requests (in-flight ones finish), then the
	// policy watcher, the limiter, and last the event buffer, which flushes.
	err = srv.Shutdown(shutCtx)
	stopReload()
	<-reloadDone
	err = errors.Join(err, lim.Close(shutCtx), closeRecorder(shutCtx))
	return err
}

// storeInfo describes the authority for /readyz.
type storeInfo struct {
	kind  string // memory | redis | redis-cluster
	guard *guard.Authority
}

func buildAuthority(ctx context.Context, cfg config, metrics *limitmetrics.Metrics, log *slog.Logger) (enforcement.Authority, storeInfo, func(), error) {
	if len(cfg.RedisAddrs) == 0 {
		log.Warn("REDIS_ADDRS is empty: single-node mode, decisions are correct for ONE limiter instance only")
		mem := enforcement.NewMemoryAuthority(nil, cfg.MaxKeys)
		stop := make(chan struct{})
		go func() {
			t := time.NewTicker(10 * time.Second)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case now := <-t.C:
					mem.Sweep(now)
				}
			}
		}()
		return mem, storeInfo{kind: "memory"}, func() { close(stop) }, nil
	}
	var rdb redis.UniversalClient
	info := storeInfo{kind: "redis"}
	if len(cfg.RedisAddrs) == 1 {
		rdb = redis.NewClient(&redis.Options{
			Addr: cfg.RedisAddrs[0], Password: cfg.RedisPassword,
			DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
			ContextTimeoutEnabled: true, MaxRetries: -1,
			PoolSize: 64, MinIdleConns: 8,
		})
	} else {
		info.kind = "redis-cluster"
		rdb = redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: cfg.RedisAddrs, Password: cfg.RedisPassword,
			DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
			ContextTimeoutEnabled: true, MaxRetries: -1,
			PoolSize: 64, MinIdleConns: 8,
		})
	}
	store := redisstore.New(rdb, cfg.RedisKeyPrefix)
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := store.Preload(pctx); err != nil {
		// Not fatal: the limiter serves degraded and recovers when Redis does.
		log.Warn("could not load the bucket script at start; serving degraded until Redis answers", "err", err)
	}
	g := guard.New(store, guard.Settings{
		Timeout:             cfg.StoreTimeout,
		ConsecutiveFailures: uint32(cfg.BreakerFailures),
		OpenFor:             cfg.BreakerOpenFor,
	}, metrics, log)
	info.guard = g
	return g, info, func() { _ = rdb.Close() }, nil
}

type readyBody struct {
	Status  string     `json:"status"` // ok | degraded
	Store   string     `json:"store"`
	Breaker string     `json:"breaker,omitempty"`
	Reason  string     `json:"reason,omitempty"`
	Policy  policyInfo `json:"policy"`
}

type policyInfo struct {
	Version int    `json:"version"`
	Hash    string `json:"hash"`
	File    string `json:"file"`
}

// readiness is always 200: a limiter whose shared store is down still
// serves (degraded), and taking it out of rotation would turn a store
// outage into a platform outage. The body says which.
func readiness(s storeInfo, p policyInfo) readyBody {
	b := readyBody{Status: "ok", Store: s.kind, Policy: p}
	if s.guard != nil {
		switch s.guard.State() {
		case guard.Open:
			b.Status, b.Breaker, b.Reason = "degraded", "open", "shared store unavailable: deciding with tightened local limits"
		case guard.HalfOpen:
			b.Status, b.Breaker, b.Reason = "degraded", "half-open", "probing the shared store"
		default:
			b.Breaker = "closed"
		}
	}
	return b
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
