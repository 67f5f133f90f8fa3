package redisclient

import (
	"reflect"
	"strings"
	"testing"

	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/limits"
)

func TestParseStores(t *testing.T) {
	for _, c := range []struct {
		in       string
		want     map[string][]string
		problems int
	}{
		{"", map[string][]string{}, 0},
		{"acme=r1:6379", map[string][]string{"acme": {"r1:6379"}}, 0},
		{" acme = r1:6379 , r2:6379 ; big=r3:6379;", map[string][]string{"acme": {"r1:6379", "r2:6379"}, "big": {"r3:6379"}}, 0},
		{"acme", map[string][]string{}, 1},
		{"default=r1:6379", map[string][]string{}, 1},
		{"a b=r1:6379", map[string][]string{}, 1},
		{"acme=r1:6379;acme=r2:6379", map[string][]string{"acme": {"r1:6379"}}, 1},
		{"acme=, ", map[string][]string{}, 1},
	} {
		var problems []string
		got := ParseStores(c.in, limits.ValidStoreName, func(format string, args ...any) { problems = append(problems, format) })
		if !reflect.DeepEqual(got, c.want) || len(problems) != c.problems {
			t.Errorf("ParseStores(%q) = %v with %d problems %v; want %v with %d", c.in, got, len(problems), problems, c.want, c.problems)
		}
	}
}

func TestStoresFromEnv(t *testing.T) {
	env := map[string]string{"REDIS_ADDRS": "d:6379", "REDIS_USERNAME": "u", "REDIS_STORES": "zed=z:6379;acme=a1:6379,a2:6379"}
	e := envconfig.New(func(k string) string { return env[k] })
	stores := StoresFromEnv(e, FromEnv(e, limits.DefaultKeyPrefix), limits.ValidStoreName)
	if err := e.Err(); err != nil {
		t.Fatal(err)
	}
	if len(stores) != 2 || stores[0].Name != "acme" || stores[1].Name != "zed" {
		t.Fatalf("stores %+v, want acme then zed", stores)
	}
	if a := stores[0].Redis; !reflect.DeepEqual(a.Addrs, []string{"a1:6379", "a2:6379"}) || a.Username != "u" || a.Kind() != KindCluster {
		t.Errorf("acme: addrs %v user %q kind %s; want its own addresses, the default's user, a Cluster", a.Addrs, a.Username, a.Kind())
	}
	// Named stores need the default one.
	env = map[string]string{"REDIS_STORES": "acme=a:6379"}
	e = envconfig.New(func(k string) string { return env[k] })
	StoresFromEnv(e, FromEnv(e, limits.DefaultKeyPrefix), limits.ValidStoreName)
	if err := e.Err(); err == nil || !strings.Contains(err.Error(), "REDIS_STORES") {
		t.Errorf("REDIS_STORES without REDIS_ADDRS: %v, want refused naming REDIS_STORES", err)
	}
	if _, err := StoresOfEnv(func(k string) string { return map[string]string{"REDIS_STORES": "x"}[k] }, limits.ValidStoreName); err == nil {
		t.Error("StoresOfEnv accepted a malformed REDIS_STORES")
	}
}
