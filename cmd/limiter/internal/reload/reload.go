// Package reload is the limiter's hot reload: a policy file re-read when
// it changes and on SIGHUP (File), and the SIGHUP re-reads of rotating
// secrets (Secret). File holds the binary's one SIGHUP handler.
package reload

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/policylog"
)

// File re-reads a policy file when it changes (fsnotify on the
// parent directory, which survives editors that write a new file and rename
// it, and Kubernetes ConfigMap symlink swaps) and on SIGHUP. A file that
// fails validation is refused: the previous policy stays in force, and a log
// line and a metric say so. A swap is one atomic pointer store, so no
// decision in flight is failed or delayed.
type File struct {
	what    string // "policy", or "shadow policy" for the candidate file
	path    string
	target  Target
	log     *slog.Logger
	active  atomic.Pointer[policylog.Info]
	results *prometheus.CounterVec
	info    *prometheus.GaugeVec
	lastOK  prometheus.Gauge
	// source, when set (log mode), is the policy in force instead of the
	// file's, and path is then empty: no file is watched or re-read.
	source func() policylog.Info
	// alsoOnHUP run on SIGHUP after the policy is re-read (the one SIGHUP
	// handler of the binary): re-reading rotated connection secrets.
	alsoOnHUP []func()
	// check, when set, refuses a valid file the binary cannot serve (a
	// store the limiter does not have), as a parse error is refused.
	check func(*policy.Policy) error
	// hup receives SIGHUP from the constructor on (Run reads it).
	hup chan os.Signal
}

// Target is what takes a policy swapped in (enforcement.Limiter, the
// shadow evaluator's candidate).
type Target interface{ SetPolicy(enforcement.Policy) }

// NewPolicy is the reloader of the enforced policy file (POLICY_FILE),
// with the metrics limiter_policy_*.
func NewPolicy(path string, target Target, reg prometheus.Registerer, log *slog.Logger) *File {
	return NewFile("policy", "limiter_policy", path, target, reg, log)
}

// NewFile is a reloader of one policy file; what names it in log lines
// and metricPrefix in metric names (the enforced file and the shadow
// candidate each have their own). It starts no goroutine, but SIGHUP is
// caught from now on and waits for Run.
func NewFile(what, metricPrefix, path string, target Target, reg prometheus.Registerer, log *slog.Logger) *File {
	r := &File{
		what: what, path: path, target: target, log: log,
		results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricPrefix + "_reloads_total",
			Help: "Reload attempts of the " + what + " file by result (ok, refused).",
		}, []string{"result"}),
		info: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: metricPrefix + "_info",
			Help: "The " + what + " in force: 1 for its version and hash.",
		}, []string{"version", "hash"}),
		lastOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: metricPrefix + "_last_reload_successful",
			Help: "1 when the last read of the " + what + " file was valid, 0 while the file on disk is refused (the one in force is then older than the file).",
		}),
	}
	r.results.WithLabelValues("ok")
	r.results.WithLabelValues("refused")
	r.lastOK.Set(1)
	reg.MustRegister(r.results, r.info, r.lastOK)
	// Registered now, not in Run: a SIGHUP sent once the limiter answers
	// must never meet the default action, which is to exit. It starts no
	// goroutine; the signal waits in hup for Run.
	r.hup = make(chan os.Signal, 1)
	signal.Notify(r.hup, syscall.SIGHUP)
	return r
}

// Set records p as the policy in force (the target already has it).
func (r *File) Set(p *policy.Policy) {
	info := &policylog.Info{Version: p.Version(), Hash: p.Hash(), File: r.path, Source: policylog.SourceFile}
	r.info.Reset()
	r.info.WithLabelValues(strconv.Itoa(info.Version), info.Hash).Set(1)
	r.active.Store(info)
}

// Current is the policy in force, as /readyz reports it.
func (r *File) Current() policylog.Info {
	if r.source != nil {
		return r.source()
	}
	return *r.active.Load()
}

// reload reads the file and swaps it in when it is valid and different.
func (r *File) reload(why string) {
	if r.path == "" {
		return // log mode
	}
	p, err := policy.Load(r.path)
	if err == nil && r.check != nil {
		err = r.check(p)
	}
	if err != nil {
		r.results.WithLabelValues("refused").Inc()
		r.lastOK.Set(0)
		r.log.Error(r.what+" refused; the previous "+r.what+" stays in force", "trigger", why,
			"version", r.Current().Version, "hash", r.Current().Hash, "err", err)
		return
	}
	r.lastOK.Set(1)
	if p.Hash() == r.Current().Hash {
		return // unchanged (several events for one change, or a file put back)
	}
	r.target.SetPolicy(p)
	r.Set(p)
	r.results.WithLabelValues("ok").Inc()
	r.log.Info(r.what+" reloaded", "trigger", why, "version", p.Version(), "hash", p.Hash())
}

// FollowLog is log mode (POLICY_SOURCE=kafka): the policy in force is
// source's, the file was only the bootstrap, and no file is watched or
// re-read; SIGHUP still runs the OnHUP actions. Call it before Run.
func (r *File) FollowLog(source func() policylog.Info) { r.path, r.source = "", source }

// Refuse makes check refuse a valid file the binary cannot serve (a store
// it does not have), as a parse error is refused. Call it before Run.
func (r *File) Refuse(check func(*policy.Policy) error) { r.check = check }

// OnHUP adds an action SIGHUP runs after the file is re-read. Call it
// before Run.
func (r *File) OnHUP(f func()) { r.alsoOnHUP = append(r.alsoOnHUP, f) }

// Run reloads on file changes and SIGHUP until ctx ends, then stops
// receiving SIGHUP. It returns nil.
func (r *File) Run(ctx context.Context) error {
	defer signal.Stop(r.hup)
	r.run(ctx, r.hup)
	return nil
}

// run watches until ctx ends. Events are debounced: editors and ConfigMap
// updates produce several events for one change.
func (r *File) run(ctx context.Context, hup <-chan os.Signal) {
	var w *fsnotify.Watcher
	var err error
	if r.path != "" { // log mode watches no file
		w, err = fsnotify.NewWatcher()
	}
	switch {
	case r.path == "":
	case err != nil:
		r.log.Error("cannot watch the "+r.what+" file; reload with SIGHUP", "err", err)
	default:
		defer w.Close()
		if err := w.Add(filepath.Dir(r.path)); err != nil {
			r.log.Error("cannot watch the "+r.what+" directory; reload with SIGHUP", "dir", filepath.Dir(r.path), "err", err)
		}
	}
	// A change made between the first load and the watch would otherwise
	// wait for the next one.
	r.reload("watch started")
	var events <-chan fsnotify.Event
	var errs <-chan error
	if w != nil {
		events, errs = w.Events, w.Errors
	}
	const debounce = 200 * time.Millisecond
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			r.reload("SIGHUP")
			for _, f := range r.alsoOnHUP {
				f()
			}
		case ev := <-events:
			name := filepath.Base(ev.Name)
			if name == filepath.Base(r.path) || name == "..data" {
				timer.Reset(debounce)
			}
		case err := <-errs:
			r.log.Warn(r.what+" watcher error", "err", err)
		case <-timer.C:
			r.reload("file change")
		}
	}
}

// Secret is a SIGHUP action (File.OnHUP) that re-reads what rotates (a
// password file, certificates): counted by result in
// limiter_secret_reloads_total{what}, logged (the error names the variable
// or file, never a secret). A failed re-read keeps what was in force.
func Secret(what string, reload func() error, reg prometheus.Registerer, log *slog.Logger) func() {
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
