// Package policyctl is the limiter's operator verbs: `limiter policy
// check|explain|replay|push|rollback|history|show|diff|restore|keygen`,
// `limiter override set|get|list|delete` and `limiter fleet status`
// (docs/reference.md, "CLI verbs"). Each exported function is one entry of
// the limiter's command table: it takes the words after the verb, writes
// to stdout and stderr, and returns the exit code (0 done, 1 refused or
// failed, 2 a usage or configuration error: nothing ran). They read their
// connections from the environment as the services do (KAFKA_*,
// POLICY_TOPIC, POLICY_*_KEY*_FILE, CLICKHOUSE_*, REDIS_STORES).
package policyctl

import "io"

// Check is `limiter policy check FILE`.
func Check(args []string, stdout, stderr io.Writer) int { return policyCheck(args, stdout, stderr) }

// Explain is `limiter policy explain FILE ...`.
func Explain(args []string, stdout, stderr io.Writer) int { return policyExplain(args, stdout, stderr) }

// Replay is `limiter policy replay [FILE] ...`.
func Replay(args []string, stdout, stderr io.Writer) int { return replayCommand(args, stdout, stderr) }

// Push, Rollback, History, Show and Diff (`limiter policy ...`) and
// OverrideSet, OverrideGet, OverrideList and OverrideDelete (`limiter
// override ...`) are in policylog.go.

// Restore is `limiter policy restore ...`.
func Restore(args []string, stdout, stderr io.Writer) int { return policyRestore(args, stdout, stderr) }

// Checkpoint is `limiter policy checkpoint [-m MESSAGE] ...`.
func Checkpoint(args []string, stdout, stderr io.Writer) int {
	return policyCheckpoint(args, stdout, stderr)
}

// Keygen is `limiter policy keygen IDENTITY --out FILE`.
func Keygen(args []string, stdout, stderr io.Writer) int { return policyKeygen(args, stdout, stderr) }

// FleetStatus is `limiter fleet status`.
func FleetStatus(args []string, stdout, stderr io.Writer) int {
	return fleetCommand("status", args, stdout, stderr)
}
