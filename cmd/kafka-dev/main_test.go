package main

import (
	"strings"
	"testing"
)

func TestConfig(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	c, err := config(env(nil))
	if err != nil || c.Port != 9092 || c.Topic != "ratelimit.decisions" || c.Partitions != 4 {
		t.Fatalf("defaults: %+v %v", c, err)
	}
	for _, bad := range []map[string]string{
		{"KAFKA_DEV_ADDR": "0.0.0.0:9092"},
		{"KAFKA_DEV_ADDR": "127.0.0.1:x"},
		{"KAFKA_DEV_PARTITIONS": "0"},
	} {
		_, err := config(env(bad))
		var name string
		for k := range bad {
			name = k
		}
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Fatalf("%v: error %v does not name %s", bad, err, name)
		}
	}
}
