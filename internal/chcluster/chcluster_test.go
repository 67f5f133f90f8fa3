package chcluster

import (
	"fmt"
	"strings"
	"testing"

	"github.com/ratewarden/ratewarden/internal/envconfig"
)

func TestFromEnv(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	e := envconfig.New(env(map[string]string{}))
	if c := FromEnv(e); c.Enabled() || e.Err() != nil {
		t.Fatalf("unset: %+v, %v (want single-node mode)", c, e.Err())
	}
	e = envconfig.New(env(map[string]string{"CLICKHOUSE_CLUSTER": "rw", "CLICKHOUSE_SHARDS": "a:1, b:2; c:3,d:4"}))
	c := FromEnv(e)
	if e.Err() != nil || !c.Enabled() || fmt.Sprint(c.Shards) != "[[a:1 b:2] [c:3 d:4]]" || fmt.Sprint(c.Nodes()) != "[a:1 b:2 c:3 d:4]" {
		t.Fatalf("got %+v nodes %v, %v", c, c.Nodes(), e.Err())
	}
	for _, bad := range []map[string]string{
		{"CLICKHOUSE_CLUSTER": "rw"},
		{"CLICKHOUSE_SHARDS": "a:1"},
		{"CLICKHOUSE_CLUSTER": "rw x", "CLICKHOUSE_SHARDS": "a:1"},
		{"CLICKHOUSE_CLUSTER": "rw", "CLICKHOUSE_SHARDS": "a:1;;b:2"},
		{"CLICKHOUSE_CLUSTER": "rw", "CLICKHOUSE_SHARDS": "a:1;a:1"},
		{"CLICKHOUSE_CLUSTER": "rw", "CLICKHOUSE_SHARDS": "a"},
	} {
		e := envconfig.New(env(bad))
		FromEnv(e)
		if e.Err() == nil || !strings.Contains(e.Err().Error(), "CLICKHOUSE_") {
			t.Errorf("%v accepted (%v)", bad, e.Err())
		}
	}
}
