package main

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
)

// policyReloader re-reads the policy file when it changes (fsnotify on the
// parent directory, which survives editors that write a new file and rename
// it, and Kubernetes ConfigMap symlink swaps) and on SIGHUP. A file that
// fails validation is refused: the previous policy stays in force, and a log
// line and a metric say so. A swap is one atomic pointer store, so no
// decision in flight is failed or delayed.
type policyReloader struct {
	what    string // "policy", or "shadow policy" for the candidate file
	path    string
	target  interface{ SetPolicy(enforcement.Policy) }
	log     *slog.Logger
	active  atomic.Pointer[policyInfo]
	results *prometheus.CounterVec
	info    *prometheus.GaugeVec
	lastOK  prometheus.Gauge
	// source, when set (log mode), is the policy in force instead of the
	// file's, and path is then empty: no file is watched or re-read.
	source func() policyInfo
	// alsoOnHUP run on SIGHUP after the policy is re-read (the one SIGHUP
	// handler of the binary): re-reading rotated connection secrets.
	alsoOnHUP []func()
	// check, when set, refuses a valid file the binary cannot serve (a
	// store the limiter does not have), as a parse error is refused.
	check func(*policy.Policy) error
	// hup receives SIGHUP from the constructor on (Run reads it).
	hup chan os.Signal
}

func newPolicyReloader(path string, target interface{ SetPolicy(enforcement.Policy) }, reg prometheus.Registerer, log *slog.Logger) *policyReloader {
	return newFileReloader("policy", "limiter_policy", path, target, reg, log)
}

// newFileReloader is a reloader of one policy file; what names it in log
// lines and metricPrefix in metric names (the enforced file and the shadow
// candidate each have their own).
func newFileReloader(what, metricPrefix, path string, target interface{ SetPolicy(enforcement.Policy) }, reg prometheus.Registerer, log *slog.Logger) *policyReloader {
	r := &policyReloader{
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

// set records p as the policy in force (the limiter already has it).
func (r *policyReloader) set(p *policy.Policy) {
	info := &policyInfo{Version: p.Version(), Hash: p.Hash(), File: r.path, Source: sourceFile}
	r.info.Reset()
	r.info.WithLabelValues(strconv.Itoa(info.Version), info.Hash).Set(1)
	r.active.Store(info)
}

func (r *policyReloader) current() policyInfo {
	if r.source != nil {
		return r.source()
	}
	return *r.active.Load()
}

// reload reads the file and swaps it in when it is valid and different.
func (r *policyReloader) reload(why string) {
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
			"version", r.current().Version, "hash", r.current().Hash, "err", err)
		return
	}
	r.lastOK.Set(1)
	if p.Hash() == r.current().Hash {
		return // unchanged (several events for one change, or a file put back)
	}
	r.target.SetPolicy(p)
	r.set(p)
	r.results.WithLabelValues("ok").Inc()
	r.log.Info(r.what+" reloaded", "trigger", why, "version", p.Version(), "hash", p.Hash())
}

// Run reloads on file changes and SIGHUP until ctx ends, then stops
// receiving SIGHUP. It returns nil.
func (r *policyReloader) Run(ctx context.Context) error {
	defer signal.Stop(r.hup)
	r.run(ctx, r.hup)
	return nil
}

// run watches until ctx ends. Events are debounced: editors and ConfigMap
// updates produce several events for one change.
func (r *policyReloader) run(ctx context.Context, hup <-chan os.Signal) {
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
