package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ratewarden/ratewarden/cmd/limiter/internal/decisionevents"
	"github.com/ratewarden/ratewarden/cmd/limiter/internal/reload"
	"github.com/ratewarden/ratewarden/cmd/limiter/internal/rlsserver"
	"github.com/ratewarden/ratewarden/cmd/limiter/internal/sharedtier"
	"github.com/ratewarden/ratewarden/cmd/limiter/internal/spans"
	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/global"
	"github.com/ratewarden/ratewarden/enforcement/hotkeys"
	"github.com/ratewarden/ratewarden/enforcement/httpapi"
	"github.com/ratewarden/ratewarden/enforcement/limitmetrics"
	"github.com/ratewarden/ratewarden/enforcement/shadow"
	"github.com/ratewarden/ratewarden/internal/bearer"
	"github.com/ratewarden/ratewarden/internal/lifecycle"
	"github.com/ratewarden/ratewarden/internal/listenaddr"
	"github.com/ratewarden/ratewarden/internal/tracing"
)

// run builds the limiter from cfg and runs its components under one
// lifecycle.Group until ctx ends; then they stop in reverse order of start
// within LIMITER_SHUTDOWN_GRACE: the HTTP and gRPC doors first (in-flight
// requests finish), then the policy watchers, the event buffer (which
// flushes), the fleet heartbeats (which leave), the limiter, the leases
// (which go back), the stores and their clients, and last the spans (those
// of the final requests included).
func run(ctx context.Context, cfg config, log *slog.Logger) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := limitmetrics.New(reg)
	// OpenTelemetry, off unless an OTLP endpoint is set (internal/tracing;
	// its variables were checked with the configuration).
	tr, err := tracing.New(os.Getenv, "limiter")
	if err != nil {
		return err
	}
	var g lifecycle.Group
	g.OnStop("tracing", tr.Shutdown)
	// A step below that fails releases what the group holds so far
	// (lifecycle.Release): the tracer, the policy log's connections, the
	// stores' clients, the gRPC listener.
	abort := func(err error) error { return g.Release(err, cfg.ShutdownGrace) }

	// The file, or the policy log read to its end (policylog.Follower).
	pol, doc, tail, err := loadPolicy(ctx, cfg, reg, log)
	if tail != nil {
		// Idempotent; the tail also closes them when it stops.
		g.OnStop("policy log connections", func(context.Context) error { tail.Close(); return nil })
	}
	if err == nil && tail == nil {
		err = sharedtier.CheckStores(cfg.Stores)(doc) // a store the policy file names must exist
	}
	if err != nil && tail == nil && cfg.PolicyLog.Source != sourceKafka {
		// The file is the configuration's: exit 2, as for a variable.
		err = lifecycle.Invalid(fmt.Errorf("POLICY_FILE: %w", err))
	}
	if err != nil {
		return abort(err)
	}
	shadowFile, err := loadShadowFile(cfg.Shadow.PolicyFile) // shadow.go
	if err != nil {
		return abort(lifecycle.Invalid(err))
	}
	mem := applyMemoryLimit(log) // memlimit.go
	if missing := sharedtier.MissingStores(pol, cfg.Stores); len(missing) > 0 {
		log.Warn("the policy log routes keys to stores REDIS_STORES does not name: those keys decide degraded here", "stores", missing)
	}

	// The shared tier, below the local tier (the path's order: sharedtier.Path).
	auth, err := sharedtier.Build(ctx, sharedtier.Config{
		Redis: cfg.Redis, Stores: cfg.Stores,
		StoreTimeout: cfg.StoreTimeout, StoreInFlight: cfg.StoreInFlight,
		BreakerFailures: cfg.BreakerFailures, BreakerOpenFor: cfg.BreakerOpenFor,
		MaxKeys: cfg.MaxKeys, MaxBytes: localMaxBytes(cfg.LocalMaxBytes, 0),
		LeaseBlock: cfg.LeaseBlock, LeaseHotOps: cfg.LeaseHotOps, LeaseMaxHold: cfg.LeaseMaxHold, KeyNames: cfg.KeyNames,
		Metrics: metrics, Log: log,
	})
	if err != nil {
		return abort(err)
	}
	auth.Add(&g)                                                                    // the stores' clients close at stop time, or on abort
	region, err := auth.BuildRegion(&g, cfg.RegionConfig, cfg.InstanceID, reg, log) // global limits across regions (the tier's deadline and breaker settings)
	if err != nil {
		return abort(err)
	}
	hot := hotkeys.New(hotkeys.Config{Owner: auth.Owner})
	reg.MustRegister(hotkeys.NewCollector(hot, cfg.KeyNames))

	// The emitter and its checker open nothing before they run.
	meter, err := decisionevents.Build(decisionevents.Config{
		Brokers: cfg.KafkaBrokers, Topic: cfg.KafkaTopic, Security: cfg.Kafka, CheckEvery: cfg.KafkaCheckEvery,
		Buffer: cfg.EmitBuffer,
		// Half the grace: the HTTP and gRPC drains come before the flush.
		FlushTimeout: cfg.ShutdownGrace / 2,
		SpoolDir:     cfg.SpoolDir, SpoolMaxBytes: cfg.SpoolMaxBytes, SpoolDrainRate: cfg.SpoolDrainRate,
		Instance: cfg.InstanceID, Region: cfg.Region,
	}, reg, log)
	var sh *shadow.Evaluator
	if err == nil {
		sh, err = buildShadow(&g, cfg, shadowFile, auth, reg, log) // shadow limits (shadow.go)
	}
	if err != nil {
		return abort(err)
	}

	// The decision path, joined in its order (sharedtier.Path).
	lim, chk, err := sharedtier.Path(enforcement.Config{
		Policy:            pol,
		ExpectedInstances: cfg.ExpectedInstances,
		LocalHeadroom:     cfg.LocalHeadroom,
		DegradedCeiling:   enforcement.Limit{Rate: cfg.DegradedRate, Burst: cfg.DegradedBurst},
		MaxKeys:           cfg.MaxKeys,
		MaxBytes:          localMaxBytes(cfg.LocalMaxBytes, mem.Container),
		ReservationTTL:    cfg.ReservationTTL,
	}, sharedtier.Parts{
		Tracer: tr, Tier: auth, Region: region, Shadow: sh,
		Metrics:  hotkeys.Observer{Tracker: hot, Next: metrics},
		Metering: meter.Recorder,
	})
	if err != nil {
		return abort(err)
	}
	limitmetrics.RegisterLocal(reg, lim)
	if cfg.Redis.Enabled() {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "limiter_policy_missing_stores",
			Help: "Stores the policy in force routes keys to that REDIS_STORES does not name (their keys decide degraded).",
		}, func() float64 { return float64(len(sharedtier.MissingStores(lim.Policy(), cfg.Stores))) }))
	}
	g.Add("limiter", lim.Run)
	g.Add("settle queue", lim.RunSettles)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "limiter_settles_queued",
		Help: "Settles and charges held because the store could not be asked, applied once it answers (docs/reserve-settle.md).",
	}, func() float64 { return float64(lim.PendingSettles()) }))
	if err := auth.AddFleet(&g, sharedtier.FleetConfig{Member: cfg.InstanceID, Every: cfg.FleetHeartbeat}, lim, metrics); err != nil {
		return abort(err)
	}
	meter.Add(&g)

	reloader := reload.NewPolicy(cfg.PolicyFile, lim, reg, log)
	reloader.Set(doc)
	reloader.Refuse(sharedtier.CheckStores(cfg.Stores))
	if tail != nil { // log mode: the file is only the bootstrap; SIGHUP still re-reads secrets
		reloader.FollowLog(tail.Current)
		meter.FollowRevision(tail.Revision)
		tail.Shadow = sh // an open rollout's candidate is the shadow policy
		tail.Missing = func(p enforcement.Policy) []string { return sharedtier.MissingStores(p, cfg.Stores) }
		tail.Target = lim
		g.Add("policy log", tail.Run)
	}
	// SIGHUP also re-reads the secrets of the connections that can rotate
	// them without a restart.
	reloader.OnHUP(meter.OnHUP)
	auth.Clients(func(what string, reloadFn func() error) {
		reloader.OnHUP(reload.Secret(what, reloadFn, reg, log))
	})
	if cfg.ListenTLS != nil {
		reloader.OnHUP(reload.Secret("listener-certificate", cfg.ListenTLS.Reload, reg, log))
	}
	g.Add("policy reloader", reloader.Run)

	mux := http.NewServeMux()
	// /check takes concurrency slots (given back on /release), and so does
	// the gRPC door (given back by Envoy's stream-done call).
	gate, err := buildSlots(cfg, auth, lim, chk, meter.SlotRecorder(), reg) // slots.go
	if err != nil {
		return abort(err)
	}
	g.Add("slots", gate.Run)
	check := httpapi.NewCheckHandler(gate, cfg.AuthToken, log)
	check.SetHeaderMode(cfg.Headers)
	mux.Handle("POST /check", tr.Handler("POST /check", check))
	mux.Handle("/check", check) // 405 for other methods
	settles := httpapi.NewSettleHandler(lim, cfg.AuthToken, log)
	mux.Handle("/settle", settles.Settle())
	mux.Handle("/charge", settles.Charge())
	leases := httpapi.NewLeaseHandler(gate, cfg.AuthToken, log)
	mux.Handle("/release", leases.Release())
	mux.Handle("/renew", leases.Renew())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, readyBody{
			Readiness: auth.Ready(r.Context(), lim.StoreFailing(), sharedtier.MissingStores(lim.Policy(), cfg.Stores)),
			Policy:    reloader.Current(),
			Metering:  meter.Status(),
			Region:    region.Status(),
		})
	})
	mux.Handle("GET /admin/hot-keys", adminOnly(cfg.AuthToken, hotkeys.Handler(hot, cfg.KeyNames)))
	addSupport(&g, mux, cfg, lim, auth, region, reloader.Current, meter.RecordReset, log) // /admin/keys/...: inspect and reset (keyapi.go)
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg, EnableOpenMetrics: true}))

	srv := &http.Server{
		Addr:              cfg.Addr,
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	grpcSrv, err := rlsserver.New(rlsserver.Config{ // the Envoy rate limit service
		Addr: cfg.GRPCAddr, AddrIsDefault: cfg.GRPCAddrIsDefault, AuthToken: cfg.AuthToken,
		TLS: cfg.ListenTLS, EnvoyHeaders: cfg.EnvoyHeaders, Slots: gate.For(cfg.EnvoyLeaseTTL),
	}, chk, reg, log, spans.GRPC(tr)...)
	if err != nil {
		return abort(err)
	}
	if grpcSrv != nil {
		g.Server("grpc", grpcSrv.Serve, grpcSrv.Shutdown) // its Shutdown closes its listener, served or not
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return abort(fmt.Errorf("listen on LIMITER_ADDR %s: %w", cfg.Addr, err))
	}
	log.Info("limiter listening", "addr", ln.Addr().String(), "store", auth.Kind,
		"expected_instances", cfg.ExpectedInstances, "policy", cfg.PolicyFile, "instance", cfg.InstanceID,
		"tls", cfg.ListenTLS != nil)
	if cfg.ListenTLS != nil {
		srv.TLSConfig = cfg.ListenTLS.Config()
	}
	if cfg.AuthToken == "" && !listenaddr.Loopback(cfg.Addr) {
		log.Warn("LIMITER_ADMIN_INSECURE=true: GET /admin/hot-keys answers anyone who reaches LIMITER_ADDR, with raw keys", "addr", cfg.Addr)
	}
	g.HTTPServer("http", srv, ln)
	g.OnStop("log", func(context.Context) error { log.Info("shutting down"); return nil })
	return g.Run(ctx, cfg.ShutdownGrace)
}

// readyBody is /readyz's answer, always 200: a limiter whose shared store
// is down still serves (degraded), and so, more so, does one whose Kafka
// refuses the metering credential (enforcement never waits on
// accounting). The body says which.
type readyBody struct {
	sharedtier.Readiness
	Policy policyInfo `json:"policy"`
	// Metering is the Kafka connection of the decision events; absent
	// when metering is off.
	Metering *decisionevents.Status `json:"metering,omitempty"`
	// Region is this limiter's region and its home's reachability;
	// absent in a one-region deployment.
	Region *global.Status `json:"region,omitempty"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// adminOnly requires the bearer token when one is configured.
func adminOnly(token string, next http.Handler) http.Handler {
	if token == "" {
		return next
	}
	auth := bearer.NewChecker(token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !auth.Allows(r.Header.Get("Authorization")) {
			writeJSON(w, http.StatusUnauthorized, map[string]any{"error": map[string]string{"code": "unauthorized", "message": "a valid bearer token is required"}})
			return
		}
		next.ServeHTTP(w, r)
	})
}
