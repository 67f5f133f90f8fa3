package main

// The limiter in log mode (POLICY_SOURCE=kafka) follows the policy log
// with a policylog.Follower; this file only reads its configuration and
// wires it.

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/policylog"
	"github.com/ratewarden/ratewarden/policylog/kafkalog"
)

// Policy sources (policylog's), the values of /readyz's policy.source.
const (
	sourceFile      = policylog.SourceFile
	sourceKafka     = policylog.SourceKafka
	sourceCache     = policylog.SourceCache
	sourceBootstrap = policylog.SourceBootstrap
)

// policyInfo is /readyz's policy; rolloutInfo its open rollout.
type (
	policyInfo  = policylog.Info
	rolloutInfo = policylog.RolloutInfo
)

var rolloutInfoOf = policylog.RolloutInfoOf

// cacheFile is the cache's file name in POLICY_CACHE_DIR.
const cacheFile = policylog.CacheFile

// policyLogConfig is POLICY_SOURCE and what log mode reads.
type policyLogConfig struct {
	Source    string        // file | kafka
	Topic     string        // POLICY_TOPIC
	CacheDir  string        // POLICY_CACHE_DIR; empty = no cache
	StartWait time.Duration // POLICY_START_WAIT: how long start waits for the log
	// Keys is POLICY_TRUSTED_KEYS_FILE: nil = records are not checked.
	Keys *policylog.Keyring
}

func policyLogConfigFrom(e *envconfig.Reader, brokers []string) policyLogConfig {
	c := policyLogConfig{
		Source:    e.String("POLICY_SOURCE", sourceFile),
		Topic:     e.String("POLICY_TOPIC", kafkalog.DefaultTopic),
		CacheDir:  e.String("POLICY_CACHE_DIR", ""),
		StartWait: e.Duration("POLICY_START_WAIT", 10*time.Second, 100*time.Millisecond, 10*time.Minute),
	}
	if path := e.String("POLICY_TRUSTED_KEYS_FILE", ""); path != "" {
		k, err := policylog.LoadKeyring(path)
		if err != nil {
			e.Fail("POLICY_TRUSTED_KEYS_FILE", "%v", err)
		}
		c.Keys = k
	}
	switch c.Source {
	case sourceFile:
	case sourceKafka:
		if len(brokers) == 0 {
			e.Fail("POLICY_SOURCE", "kafka needs KAFKA_BROKERS")
		}
	default:
		e.Fail("POLICY_SOURCE", "%q is not file or kafka", c.Source)
	}
	return c
}

// newPolicyTail is the follower of the log cfg names.
func newPolicyTail(cfg config, reg prometheus.Registerer, logger *slog.Logger) (*policylog.Follower, error) {
	l, err := kafkalog.New(kafkalog.Config{
		Brokers: cfg.KafkaBrokers, Topic: cfg.PolicyLog.Topic, Security: cfg.Kafka, ClientID: "limiter-policy",
		Timeout: 5 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	return policylog.NewFollower(policylog.FollowerConfig{
		Log: l, Topic: cfg.PolicyLog.Topic, CacheDir: cfg.PolicyLog.CacheDir, StartWait: cfg.PolicyLog.StartWait,
		Bootstrap: cfg.PolicyFile, Metrics: policylog.NewMetrics(reg), Logger: logger, Keys: cfg.PolicyLog.Keys,
	}), nil
}

// loadPolicy is the policy to start with, by POLICY_SOURCE: the file
// (doc is then the file, tail nil), or the policy log (tail set).
func loadPolicy(ctx context.Context, cfg config, reg prometheus.Registerer, log *slog.Logger) (pol enforcement.Policy, doc *policy.Policy, tail *policylog.Follower, err error) {
	if cfg.PolicyLog.Source != sourceKafka {
		p, err := policy.Load(cfg.PolicyFile)
		if err != nil {
			return nil, nil, nil, err
		}
		policylog.NewMetrics(reg).Set(policyInfo{Source: sourceFile})
		return p, p, nil, nil
	}
	tail, err = newPolicyTail(cfg, reg, log)
	if err != nil {
		return nil, nil, nil, err
	}
	pol, err = tail.Start(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	log.Info("policy from the policy log", "topic", cfg.PolicyLog.Topic, "source", tail.Current().Source,
		"revision", tail.Current().Revision, "hash", tail.Current().Hash)
	return pol, pol.(*policy.WithOverrides).Policy, tail, nil
}
