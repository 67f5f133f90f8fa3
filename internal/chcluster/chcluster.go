// Package chcluster is ClickHouse cluster mode's configuration
// (docs/scaling.md, "ClickHouse cluster mode"): the cluster's name in the
// servers' remote_servers and the native addresses of every replica of
// every shard, read from CLICKHOUSE_CLUSTER and CLICKHOUSE_SHARDS by the
// meter-consumer and the usage API alike. Both unset is single-node mode,
// the default.
package chcluster

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/ratewarden/ratewarden/internal/envconfig"
)

// Config is the cluster, or single-node mode when Name is "".
type Config struct {
	// Name is the cluster in the servers' remote_servers, which the
	// Distributed tables name (CLICKHOUSE_CLUSTER).
	Name string
	// Shards lists, shard by shard, the native addresses of its replicas
	// (CLICKHOUSE_SHARDS: "a:9000,b:9000;c:9000,d:9000"). The order of the
	// shards is the order of the servers' remote_servers: the consumer
	// writes Kafka partition p to shard p mod len(Shards).
	Shards [][]string
}

// Enabled reports cluster mode.
func (c Config) Enabled() bool { return c.Name != "" }

// Nodes is every replica's address, shard by shard: what the schema
// migrates.
func (c Config) Nodes() []string {
	var out []string
	for _, s := range c.Shards {
		out = append(out, s...)
	}
	return out
}

var validName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// FromEnv reads CLICKHOUSE_CLUSTER and CLICKHOUSE_SHARDS, recording any
// problem in e.
func FromEnv(e *envconfig.Reader) Config {
	c := Config{Name: e.String("CLICKHOUSE_CLUSTER", "")}
	raw := e.String("CLICKHOUSE_SHARDS", "")
	switch {
	case c.Name == "" && raw == "":
		return c
	case c.Name == "":
		e.Fail("CLICKHOUSE_CLUSTER", "required with CLICKHOUSE_SHARDS (the cluster's name in remote_servers)")
		return c
	case raw == "":
		e.Fail("CLICKHOUSE_SHARDS", "required with CLICKHOUSE_CLUSTER (replicas separated by \",\", shards by \";\")")
		return c
	}
	if !validName.MatchString(c.Name) {
		e.Fail("CLICKHOUSE_CLUSTER", "%q is not an identifier", c.Name)
	}
	shards, err := ParseShards(raw)
	if err != nil {
		e.Fail("CLICKHOUSE_SHARDS", "%v", err)
		return c
	}
	for _, a := range flatten(shards) {
		e.HostPort("CLICKHOUSE_SHARDS", a)
	}
	c.Shards = shards
	return c
}

func flatten(shards [][]string) []string { return Config{Shards: shards}.Nodes() }

// ParseShards reads the CLICKHOUSE_SHARDS form: shards separated by ";",
// the native addresses of a shard's replicas separated by ",".
func ParseShards(s string) ([][]string, error) {
	var out [][]string
	seen := map[string]bool{}
	for i, shard := range strings.Split(s, ";") {
		var replicas []string
		for _, a := range strings.Split(shard, ",") {
			if a = strings.TrimSpace(a); a == "" {
				continue
			}
			if seen[a] {
				return nil, fmt.Errorf("%s is listed twice", a)
			}
			seen[a] = true
			replicas = append(replicas, a)
		}
		if len(replicas) == 0 {
			return nil, fmt.Errorf("shard %d has no replica address", i+1)
		}
		out = append(out, replicas)
	}
	return out, nil
}
