package main

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

func TestRegionConfig(t *testing.T) {
	base := map[string]string{"REDIS_ADDRS": "127.0.0.1:6379"}
	load := func(kv ...string) (config, error) {
		env := map[string]string{}
		for k, v := range base {
			env[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			env[kv[i]] = kv[i+1]
		}
		return loadConfig(func(k string) string { return env[k] })
	}
	c, err := load()
	if err != nil || c.Region != "" || c.Regions != nil || c.GlobalRedis.Enabled() {
		t.Fatalf("one region: %+v %v", c.Regions, err)
	}
	c, err = load("LIMITER_REGION", "b", "LIMITER_REGIONS", "a, b,c", "GLOBAL_REDIS_ADDRS", "10.0.0.1:6379", "GLOBAL_REDIS_TLS", "false")
	if err != nil || c.Region != "b" || strings.Join(c.Regions, ",") != "a,b,c" || c.GlobalRedis.Addrs[0] != "10.0.0.1:6379" || c.HomeTimeout != time.Second {
		t.Fatalf("region b: %+v %v", c, err)
	}
	c, err = load("LIMITER_REGION", "b", "LIMITER_REGIONS", "a,b", "GLOBAL_REDIS_ADDRS", "h:1", "LIMITER_REGION_HOME_TIMEOUT", "2500ms")
	if err != nil || c.HomeTimeout != 2500*time.Millisecond {
		t.Fatalf("LIMITER_REGION_HOME_TIMEOUT=2500ms: %v %v", c.HomeTimeout, err)
	}
	for _, bad := range []struct {
		env  []string
		want string
	}{
		{[]string{"LIMITER_REGION", "Eu_West", "LIMITER_REGIONS", "Eu_West", "GLOBAL_REDIS_ADDRS", "h:1"}, `LIMITER_REGION: "Eu_West" is not a region name`},
		{[]string{"LIMITER_REGION", "b", "GLOBAL_REDIS_ADDRS", "h:1"}, "LIMITER_REGIONS: is empty while LIMITER_REGION"},
		{[]string{"LIMITER_REGION", "b", "LIMITER_REGIONS", "a,c", "GLOBAL_REDIS_ADDRS", "h:1"}, `LIMITER_REGIONS: does not name LIMITER_REGION "b"`},
		{[]string{"LIMITER_REGION", "b", "LIMITER_REGIONS", "a,b,a", "GLOBAL_REDIS_ADDRS", "h:1"}, `names region "a" twice`},
		{[]string{"LIMITER_REGION", "b", "LIMITER_REGIONS", "a,b"}, "GLOBAL_REDIS_ADDRS: is empty while LIMITER_REGION"},
		{[]string{"LIMITER_REGIONS", "a,b"}, "LIMITER_REGIONS: is set while LIMITER_REGION is empty"},
		{[]string{"GLOBAL_REDIS_ADDRS", "h:1"}, "GLOBAL_REDIS_ADDRS: is set while LIMITER_REGION is empty"},
		{[]string{"LIMITER_REGION", "b", "LIMITER_REGIONS", "a,b", "GLOBAL_REDIS_ADDRS", "nohost"}, "GLOBAL_REDIS_ADDRS"},
		{[]string{"LIMITER_REGION", "b", "LIMITER_REGIONS", "a,b", "GLOBAL_REDIS_ADDRS", "h:1", "REDIS_ADDRS", " "}, "REDIS_ADDRS: is empty while LIMITER_REGION"},
		{[]string{"LIMITER_REGION", "b", "LIMITER_REGIONS", "a,b", "GLOBAL_REDIS_ADDRS", "h:1", "LIMITER_REGION_HOME_TIMEOUT", "10ms"}, "LIMITER_REGION_HOME_TIMEOUT"},
	} {
		_, err := load(bad.env...)
		if err == nil || !strings.Contains(err.Error(), bad.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: error %v, want one line with %q", bad.env, err, bad.want)
		}
	}
}

const regionPolicy = `
version: 1
default_tier: global
tiers:
  global: { rate: 100, burst: 100, scope: global }
  local:  { rate: 100, burst: 100 }
keys: { acct_local: local }
`

// TestRegionProcess: a limiter started as region b of a,b,c decides a
// global tier from its pool of the home's budget (source shared), a
// regional one as before, reports its region in /readyz, and with the
// home frozen decides the global tier on its escrow (source regional)
// while /readyz stays 200 and "ok"; it rejoins after the home thaws.
func TestRegionProcess(t *testing.T) {
	regional, home := testenv.StartRedis(t), testenv.StartRedis(t)
	p := startLimiter(t, regionPolicy, "LIMITER_GRPC_ADDR=", "REDIS_ADDRS="+regional.Addr(),
		"LIMITER_REGION=b", "LIMITER_REGIONS=a,b,c", "GLOBAL_REDIS_ADDRS="+home.Addr())
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(testenv.Timeout(20 * time.Second))
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("not within 20s: %s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor("a global decision allowed from the pool", func() bool {
		d, _ := p.check(t, "acct_g", "api", 1)
		return d.Allowed && d.Source == "shared"
	})
	if d, _ := p.check(t, "acct_local", "api", 1); !d.Allowed || d.Source != "shared" {
		t.Fatalf("regional tier: %+v", d)
	}
	// /readyz is polled: a fleet heartbeat or a global call that a
	// starved process could not make in time shows there until the next.
	var r, reg map[string]any
	waitFor("readyz names region b of 3 with the home reachable", func() bool {
		r = p.readyz(t)
		reg, _ = r["region"].(map[string]any)
		return reg["name"] == "b" && reg["global"] == "ok" && reg["regions"] == float64(3)
	})
	if p.metric(t, "limiter_region_global_up") != 1 {
		t.Fatal("limiter_region_global_up is not 1")
	}

	if err := home.Process().Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer home.Process().Signal(syscall.SIGCONT)
	waitFor("a global decision on the escrow", func() bool {
		d, _ := p.check(t, "acct_g", "api", 1)
		return d.Allowed && d.Source == "regional"
	})
	waitFor("readyz 200 and ok, the home unreachable, while the home is cut", func() bool {
		r = p.readyz(t)
		reg, _ = r["region"].(map[string]any)
		return r["httpStatus"] == 200 && r["status"] == "ok" && reg["global"] == "unreachable"
	})
	if p.metric(t, `limiter_decisions_total{result="allowed",source="regional"}`) < 1 || p.metric(t, "limiter_region_global_up") != 0 {
		t.Fatal("the escrow decisions are not counted, or the home is not reported down")
	}
	home.Process().Signal(syscall.SIGCONT)
	waitFor("the home reachable again", func() bool {
		reg, _ := p.readyz(t)["region"].(map[string]any)
		return reg["global"] == "ok"
	})
	waitFor("global decisions from the pool again", func() bool {
		d, _ := p.check(t, "acct_g", "api", 1)
		return d.Allowed && d.Source == "shared"
	})
}
