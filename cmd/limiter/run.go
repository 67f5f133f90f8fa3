package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/fleet"
	"github.com/ratewarden/ratewarden/enforcement/hotkeys"
	"github.com/ratewarden/ratewarden/enforcement/httpapi"
	"github.com/ratewarden/ratewarden/enforcement/lease"
	"github.com/ratewarden/ratewarden/enforcement/limitmetrics"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/enforcement/shadow"
	"github.com/ratewarden/ratewarden/enforcement/split"
	"github.com/ratewarden/ratewarden/internal/bearer"
	"github.com/ratewarden/ratewarden/internal/lifecycle"
	"github.com/ratewarden/ratewarden/internal/listenaddr"
	"github.com/ratewarden/ratewarden/internal/redisclient"
	"github.com/ratewarden/ratewarden/internal/tracing"
	"github.com/ratewarden/ratewarden/limits"
	"github.com/ratewarden/ratewarden/metering/kafkaemit"
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
		err = checkStores(cfg.Stores)(doc) // a store the policy file names must exist
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
	if missing := missingStores(pol, cfg.Stores); len(missing) > 0 {
		log.Warn("the policy log routes keys to stores REDIS_STORES does not name: those keys decide degraded here", "stores", missing)
	}

	auth, err := buildAuthority(ctx, cfg, metrics, log)
	if err != nil {
		return abort(err)
	}
	auth.add(&g) // the stores' clients close at stop time, or on abort
	hot := hotkeys.New(hotkeys.Config{Owner: auth.info.owner})
	reg.MustRegister(hotkeys.NewCollector(hot, cfg.KeyNames))

	// The emitter and its checker open nothing before they run.
	meter, err := buildRecorder(cfg, reg, log)
	var sh *shadow.Evaluator
	if err == nil {
		sh, err = buildShadow(&g, cfg, shadowFile, auth, reg, log) // shadow limits (shadow.go)
	}
	if err != nil {
		return abort(err)
	}

	lim, err := enforcement.New(enforcement.Config{
		Authority:         traced(tr, auth), // a span per store call when tracing is on (tracing.go)
		Policy:            pol,
		ExpectedInstances: cfg.ExpectedInstances,
		LocalHeadroom:     cfg.LocalHeadroom,
		DegradedCeiling:   enforcement.Limit{Rate: cfg.DegradedRate, Burst: cfg.DegradedBurst},
		MaxKeys:           cfg.MaxKeys,
		MaxBytes:          localMaxBytes(cfg.LocalMaxBytes, mem.Container),
		Observer:          hotkeys.Observer{Tracker: hot, Next: metrics},
		Recorder:          meter.rec,
		Shadow:            sh,
		Reservations:      auth.reservations, // reserve, settle and charge: the stores themselves, unwrapped
		ReservationTTL:    cfg.ReservationTTL,
	})
	if err != nil {
		return abort(err)
	}
	limitmetrics.RegisterLocal(reg, lim)
	if cfg.Redis.Enabled() {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "limiter_policy_missing_stores",
			Help: "Stores the policy in force routes keys to that REDIS_STORES does not name (their keys decide degraded).",
		}, func() float64 { return float64(len(missingStores(lim.Policy(), cfg.Stores))) }))
	}
	g.Add("limiter", lim.Run)
	g.Add("settle queue", lim.RunSettles)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "limiter_settles_queued",
		Help: "Settles and charges held because the store could not be asked, applied once it answers (docs/reserve-settle.md).",
	}, func() float64 { return float64(lim.PendingSettles()) }))
	if err := buildFleet(&g, auth, cfg, lim, metrics, log); err != nil {
		return abort(err)
	}
	meter.add(&g)

	reloader := newPolicyReloader(cfg.PolicyFile, lim, reg, log)
	reloader.set(doc)
	reloader.check = checkStores(cfg.Stores)
	if tail != nil { // log mode: the file is only the bootstrap; SIGHUP still re-reads secrets
		reloader.path, reloader.source = "", tail.Current
		if r, ok := meter.rec.(*meteringRecorder); ok {
			r.revision = tail.Revision
		}
		tail.Shadow = sh // an open rollout's candidate is the shadow policy
		tail.Missing = func(p enforcement.Policy) []string { return missingStores(p, cfg.Stores) }
		tail.Target = lim
		g.Add("policy log", tail.Run)
	}
	// SIGHUP also re-reads the secrets of the connections that can rotate
	// them without a restart.
	reloader.alsoOnHUP = append(reloader.alsoOnHUP, meter.onHUP)
	for _, h := range auth.stores {
		what := "redis"
		if h.name != limits.DefaultStore {
			what = "redis:" + h.name
		}
		reloader.alsoOnHUP = append(reloader.alsoOnHUP, secretReloader(what, h.conn.Reload, reg, log))
	}
	if cfg.ListenTLS != nil {
		reloader.alsoOnHUP = append(reloader.alsoOnHUP, secretReloader("listener-certificate", cfg.ListenTLS.Reload, reg, log))
	}
	g.Add("policy reloader", reloader.Run)

	mux := http.NewServeMux()
	chk := tracedCheck(tr, lim) // lim itself when tracing is off
	check := httpapi.NewCheckHandler(chk, cfg.AuthToken, log)
	check.SetHeaderMode(cfg.Headers)
	mux.Handle("POST /check", tr.Handler("POST /check", check))
	mux.Handle("/check", check) // 405 for other methods
	settles := httpapi.NewSettleHandler(lim, cfg.AuthToken, log)
	mux.Handle("/settle", settles.Settle())
	mux.Handle("/charge", settles.Charge())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		b := readiness(r.Context(), auth.info, lim.StoreFailing(), reloader.current(), meter.ready)
		addSpool(&b, meter.spool)
		addStores(&b, auth, missingStores(lim.Policy(), cfg.Stores))
		writeJSON(w, http.StatusOK, b)
	})
	mux.Handle("GET /admin/hot-keys", adminOnly(cfg.AuthToken, hotkeys.Handler(hot, cfg.KeyNames)))
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg, EnableOpenMetrics: true}))

	srv := &http.Server{
		Addr:              cfg.Addr,
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	grpcSrv, err := newGRPC(cfg, chk, reg, log, grpcTracing(tr)...) // the Envoy rate limit service (grpc.go)
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
	log.Info("limiter listening", "addr", ln.Addr().String(), "store", auth.info.kind,
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

// secretReloader is a SIGHUP action that re-reads what rotates (a
// password file, certificates): counted by result in
// limiter_secret_reloads_total{what}, logged (the error names the variable
// or file, never a secret). A failed re-read keeps what was in force.
func secretReloader(what string, reload func() error, reg prometheus.Registerer, log *slog.Logger) func() {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name:        "limiter_secret_reloads_total",
		Help:        "Re-reads on SIGHUP of rotating credentials and certificates, by result (ok, failed).",
		ConstLabels: prometheus.Labels{"what": what},
	}, []string{"result"})
	ok, failed := c.WithLabelValues("ok"), c.WithLabelValues("failed")
	reg.MustRegister(c)
	return func() {
		if err := reload(); err != nil {
			failed.Inc()
			log.Error("re-reading on SIGHUP failed; the previous ones stay in force", "what", what, "err", err)
			return
		}
		ok.Inc()
		log.Info("re-read on SIGHUP", "what", what)
	}
}

// storeInfo describes the authority for /readyz.
type storeInfo struct {
	kind   string                             // memory | redis | redis-cluster | redis-sentinel
	states func() map[string]redisstore.State // breaker state per shard; nil in memory mode
	owner  func(slot uint16) string           // the shard of a hash slot (hot-key visibility); nil = one server
	// failing reports store trouble the breakers have not (yet) seen: the
	// fleet heartbeat failing while traffic is too light to trip them. nil = none.
	failing func() bool
	// diagnose says why Redis does not answer (refused credentials, a
	// failed TLS handshake, ...), "" when it does; asked only while
	// degraded. nil in memory mode.
	diagnose func(ctx context.Context) string
}

// authority is the shared tier as built from the configuration, with the
// components that run it.
type authority struct {
	enforcement.Authority
	info storeInfo
	// The leasing layer when leasing is on.
	lease *lease.Authority
	// stores are every shared store, the default one first, then
	// REDIS_STORES's in name order.
	stores []*storeHandle
	fleet  fleetCounts // each store's fleet count
	// rdb is the Redis client (nil in single-node mode): the shadow tier
	// builds its own store, in its own key namespace, on it.
	rdb redis.UniversalClient
	// mem is single-node mode's in-process authority (nil with Redis).
	mem *enforcement.MemoryAuthority
	// reservations keeps reservations: the store routing, or mem.
	reservations enforcement.Reserver
}

// add registers what runs the authority: each store (its client closed
// after it), then the leases, which go back before the stores stop.
func (a *authority) add(g *lifecycle.Group) {
	if a.mem != nil {
		g.Add("memory sweeper", a.mem.Run)
	}
	for _, h := range a.stores {
		h.add(g)
	}
	if a.lease != nil {
		g.Add("leases", a.lease.Run) // returns held tokens while Redis is still open
	}
}

// closeClients closes the stores' clients opened so far when
// buildAuthority fails part way (after it, the group closes them).
func (a *authority) closeClients() {
	for _, h := range a.stores {
		_ = h.conn.Close()
	}
}

// buildAuthority assembles the shared tier. With Redis the chain, from the
// limiter outwards, is: lease (hot keys spend leased blocks in-process,
// when LIMITER_LEASE_BLOCK is set) → split (split keys spread over
// sub-buckets) → stores (enforcement.Stores: the store the key's limit
// names) → shared (redisstore.Shared, one per store) → guard (a deadline
// and circuit breaker per shard) → lane (one server's auto-pipelined
// EVALSHA of the bucket script).
func buildAuthority(ctx context.Context, cfg config, metrics *limitmetrics.Metrics, log *slog.Logger) (*authority, error) {
	if !cfg.Redis.Enabled() {
		log.Warn("REDIS_ADDRS is empty: single-node mode, decisions are correct for ONE limiter instance only")
		mem := memoryAuthority(cfg.MaxKeys, localMaxBytes(cfg.LocalMaxBytes, 0))
		return &authority{Authority: split.New(mem, nil), info: storeInfo{kind: "memory"}, mem: mem, reservations: mem}, nil
	}

	// Standalone, Cluster or Sentinel, with TLS and an ACL user as
	// configured (internal/redisclient, the one place that reads REDIS_*);
	// then each store REDIS_STORES names, reached alike (stores.go).
	def, err := openStore(ctx, limits.DefaultStore, cfg.Redis, cfg, metrics, log)
	if err != nil {
		return nil, err
	}
	a := &authority{info: storeInfo{kind: def.kind, diagnose: def.conn.Diagnose, states: def.shared.States},
		rdb: def.conn.UniversalClient, stores: []*storeHandle{def}}
	if a.info.kind == redisclient.KindCluster {
		a.info.owner = def.shared.Owner
	}
	for _, ns := range cfg.Stores {
		h, err := openStore(ctx, ns.Name, ns.Redis, cfg, nil, log)
		if err != nil {
			a.closeClients()
			return nil, err
		}
		a.stores = append(a.stores, h)
	}
	// Each key's calls go to the store its limit names (enforcement.Stores).
	routed := enforcement.NewStores(def.shared, namedStores(a.stores[1:]))
	a.reservations = routed
	a.Authority = split.New(routed, nil)
	if cfg.LeaseBlock > 0 {
		a.lease = lease.New(a.Authority, routed, lease.Config{
			Block:        int64(cfg.LeaseBlock),
			HotOpsPerSec: cfg.LeaseHotOps,
			MaxHold:      cfg.LeaseMaxHold,
			// The store's guard judges lateness (and tells a starved
			// process from a slow store); this is only the outer bound
			// of a lease call.
			Timeout: time.Second,
			Log:     log,
			Names:   cfg.KeyNames,
		})
		a.Authority = a.lease
	}
	return a, nil
}

// buildFleet adds a fleet heartbeat per shared store: the live instance
// count (never below LIMITER_EXPECTED_INSTANCES) is what the limiter's
// local tier, degraded limits and quota share divide by, and what the
// hot-key threshold is shared over. Each leaves its fleet when stopped.
func buildFleet(g *lifecycle.Group, a *authority, cfg config, lim *enforcement.Limiter, metrics *limitmetrics.Metrics, log *slog.Logger) error {
	metrics.Instances(lim.Instances())
	for _, h := range a.stores {
		hlog := log
		if h.name != limits.DefaultStore {
			hlog = log.With("store", h.name)
		}
		hb, err := fleet.New(h.shared, fleet.Config{
			Member: cfg.InstanceID,
			Every:  cfg.FleetHeartbeat,
			Log:    hlog,
			OnCount: func(n int) {
				lim.SetInstances(a.fleet.set(h.name, n)) // the largest count; never below LIMITER_EXPECTED_INSTANCES
				n = lim.Instances()
				if a.lease != nil {
					a.lease.SetInstances(n)
				}
				metrics.Instances(n)
			},
		})
		if err != nil {
			return err
		}
		h.hb = hb
		g.Add("fleet heartbeat "+h.name, hb.Run)
		if h.name == limits.DefaultStore {
			a.info.failing = hb.Failing
		}
	}
	return nil
}

// memoryAuthority is the in-process authority of single-node mode,
// bounded as the local tier is (LIMITER_MAX_KEYS and
// LIMITER_LOCAL_MAX_BYTES, a bound of its own); its Run sweeps.
func memoryAuthority(maxKeys int, maxBytes int64) *enforcement.MemoryAuthority {
	return enforcement.NewMemoryAuthorityBytes(nil, maxKeys, maxBytes)
}

type readyBody struct {
	Status  string `json:"status"` // ok | degraded
	Store   string `json:"store"`
	Breaker string `json:"breaker,omitempty"`
	Reason  string `json:"reason,omitempty"`
	// Cause is why Redis does not answer, in words (refused credentials, a
	// failed TLS handshake, a refused connection), while degraded; it names
	// the variables to check and never a secret.
	Cause  string     `json:"cause,omitempty"`
	Policy policyInfo `json:"policy"`
	// Metering is the Kafka connection of the decision events; absent
	// when metering is off.
	Metering *meteringStatus `json:"metering,omitempty"`
	// Stores is every shared store by name ("default" and REDIS_STORES's);
	// absent in single-node mode.
	Stores map[string]storeReady `json:"stores,omitempty"`
}

// addStores fills b.Stores; a named store that is degraded or missing
// (the policy in force routes keys to it, REDIS_STORES does not name it)
// makes the whole limiter's status degraded too (its keys are), the
// reason naming it.
func addStores(b *readyBody, a *authority, missing []string) {
	if len(a.stores) == 0 {
		return
	}
	b.Stores = make(map[string]storeReady, len(a.stores)+len(missing))
	var down []string
	for _, h := range a.stores {
		r := readyOf(h, a.fleet.get(h.name))
		b.Stores[h.name] = r
		if h.name != limits.DefaultStore && r.Status != "ok" {
			down = append(down, h.name)
		}
	}
	for _, name := range missing {
		b.Stores[name] = storeReady{Status: "missing", Breaker: "none",
			Reason: "the policy in force routes keys to it, but REDIS_STORES does not name it: its keys decide with tightened local limits"}
		down = append(down, name)
	}
	if len(down) > 0 && b.Status == "ok" {
		b.Status = "degraded"
		b.Reason = "store " + strings.Join(down, ", ") + " unavailable: the keys routed to it decide with tightened local limits"
	}
}

// meteringStatus is "ok", or "failing" with the reason (a refused
// credential, an untrusted certificate, no broker): events are being
// spooled, or without a spool dropped and counted, meanwhile.
type meteringStatus struct {
	Status string `json:"status"`
	Reason string `json:"reason,omitempty"`
	// Spool is the state of LIMITER_SPOOL_DIR's spool; absent without one.
	Spool *spoolReady `json:"spool,omitempty"`
}

// spoolReady is the spool in /readyz: what it holds, how old its oldest
// event is, and how fast Kafka is taking it back.
type spoolReady struct {
	Bytes            int64   `json:"bytes"`
	MaxBytes         int64   `json:"maxBytes"`
	Events           int64   `json:"events"`
	OldestAgeSeconds float64 `json:"oldestAgeSeconds"`
	DrainPerSecond   float64 `json:"drainPerSecond"`
	// WaitingForKafka: a Kafka write failed and none has succeeded since;
	// new events go to the spool.
	WaitingForKafka bool `json:"waitingForKafka"`
}

// addSpool reports the spool in b.Metering; the limiter's status is not
// changed by it (enforcement never waits on accounting).
func addSpool(b *readyBody, spool func() (kafkaemit.SpoolStatus, bool)) {
	if b.Metering == nil || spool == nil {
		return
	}
	st, ok := spool()
	if !ok {
		return
	}
	b.Metering.Spool = &spoolReady{Bytes: st.Bytes, MaxBytes: st.MaxBytes, Events: st.Events,
		OldestAgeSeconds: st.OldestAge.Seconds(), DrainPerSecond: st.DrainPerSecond, WaitingForKafka: st.WaitingForKafka}
}

// readinessCauseWait is how long /readyz waits for a fresh diagnosis.
const readinessCauseWait = 250 * time.Millisecond

// readiness is always 200: a limiter whose shared store is down still
// serves (degraded), and taking it out of rotation would turn a store
// outage into a platform outage; the same holds, more so, for a Kafka that
// refuses the metering credential (enforcement never waits on accounting).
// The body says which.
func readiness(ctx context.Context, s storeInfo, storeFailing bool, p policyInfo, metering func() (bool, string)) readyBody {
	b := readyBody{Status: "ok", Store: s.kind, Policy: p}
	if metering != nil {
		b.Metering = &meteringStatus{Status: "ok"}
		if ok, why := metering(); !ok {
			b.Metering = &meteringStatus{Status: "failing", Reason: why}
		}
	}
	if s.states == nil {
		return b
	}
	var down []string
	b.Breaker, down = breakerOf(s.states())
	switch {
	case len(down) > 0:
		b.Status = "degraded"
		b.Reason = "shared store unavailable (" + strings.Join(down, ", ") + "): deciding with tightened local limits"
	case storeFailing:
		b.Status = "degraded"
		b.Reason = "the latest decision could not ask the shared store: decided with tightened local limits"
	case s.failing != nil && s.failing():
		b.Status = "degraded"
		b.Reason = "the fleet heartbeat cannot reach the shared store: decisions will be degraded"
	}
	if b.Status == "degraded" && s.diagnose != nil {
		// A probe waits this long for a fresh cause, then gets the latest
		// one (redisclient.Diagnose): with every Cluster node down a PING
		// takes its whole deadline, and a readiness probe that slow on a
		// busy machine would take every limiter out of rotation.
		ctx, cancel := context.WithTimeout(ctx, readinessCauseWait)
		defer cancel()
		b.Cause = s.diagnose(ctx)
	}
	return b
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
