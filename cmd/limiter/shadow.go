package main

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/cmd/limiter/internal/reload"
	"github.com/ratewarden/ratewarden/cmd/limiter/internal/sharedtier"
	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/limitmetrics"
	"github.com/ratewarden/ratewarden/enforcement/shadow"
	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/internal/lifecycle"
	"github.com/ratewarden/ratewarden/policy"
)

// shadowConfig is the shadow tier's part of the configuration.
type shadowConfig struct {
	// PolicyFile is a whole candidate policy evaluated beside the enforced
	// one (LIMITER_SHADOW_POLICY_FILE); empty = the enforced file's rules
	// marked shadow.
	PolicyFile string
	// Timeout is the deadline of one shadow store call
	// (LIMITER_SHADOW_TIMEOUT, default LIMITER_STORE_TIMEOUT).
	Timeout time.Duration
}

// shadowConfigFrom reads the shadow tier's variables.
func shadowConfigFrom(e *envconfig.Reader, storeTimeout time.Duration) shadowConfig {
	return shadowConfig{
		PolicyFile: e.String("LIMITER_SHADOW_POLICY_FILE", ""),
		Timeout:    e.Duration("LIMITER_SHADOW_TIMEOUT", storeTimeout, 100*time.Microsecond, 10*time.Second),
	}
}

// candidateSetter gives the reloader of the candidate file its target.
type candidateSetter struct{ ev *shadow.Evaluator }

func (c candidateSetter) SetPolicy(p enforcement.Policy) { c.ev.SetCandidate(p) }

// loadShadowFile reads LIMITER_SHADOW_POLICY_FILE (nil when unset). A
// file that does not load is the configuration's error, found before
// anything starts.
func loadShadowFile(path string) (*policy.Policy, error) {
	if path == "" {
		return nil, nil
	}
	p, err := policy.Load(path)
	if err != nil {
		return nil, fmt.Errorf("LIMITER_SHADOW_POLICY_FILE: %w", err)
	}
	return p, nil
}

// buildShadow assembles the shadow tier: its own store namespace, its own
// deadline and breaker (a slow shadow never opens the enforced breaker),
// and the candidate policy when LIMITER_SHADOW_POLICY_FILE is set. It adds
// what runs it to g, after the authority's stores: it stops before the
// client it shares with the default store closes.
func buildShadow(g *lifecycle.Group, cfg config, candidateFile *policy.Policy, a *sharedtier.Tier, reg prometheus.Registerer, log *slog.Logger) (*shadow.Evaluator, error) {
	log = log.With("tier", "shadow")
	var candidate enforcement.Policy
	if candidateFile != nil {
		candidate = candidateFile
		log.Info("shadow policy: every decision is also evaluated under the candidate file (reported, never enforced)",
			"file", cfg.Shadow.PolicyFile, "hash", candidateFile.Hash())
	}
	chain, run, _ := a.ShadowChain(cfg.Shadow.Timeout, log) // split → store → guard → pipeline (sharedtier.Path)
	ev, err := shadow.New(shadow.Config{
		Authority:         chain,
		Candidate:         candidate,
		ExpectedInstances: cfg.ExpectedInstances,
		LocalHeadroom:     cfg.LocalHeadroom,
		MaxKeys:           cfg.MaxKeys,
		MaxBytes:          cfg.LocalMaxBytes, // 0: enforcement's default
		Timeout:           time.Second,       // the outer bound; the guard's deadline is the real one
		Observer:          limitmetrics.NewShadow(reg),
	})
	if err != nil {
		return nil, err
	}
	g.Add("shadow store", run)
	g.Add("shadow limiter", ev.Run)
	if candidateFile != nil {
		// The candidate file reloads as the enforced one does (file watch
		// and SIGHUP), with metrics of its own (limiter_shadow_policy_*).
		rl := reload.NewFile("shadow policy", "limiter_shadow_policy", cfg.Shadow.PolicyFile, candidateSetter{ev}, reg, log)
		rl.Set(candidateFile)
		g.Add("shadow policy reloader", rl.Run)
	}
	return ev, nil
}
