package deploytest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/keyslot"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/testkit/repo"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// quotaKeeping are the redis-server settings that keep quota counters
// (docs/backends.md, "Redis settings that keep quotas").
var quotaKeeping = [][2]string{{"appendonly", "yes"}, {"appendfsync", "everysec"}, {"maxmemory-policy", "volatile-ttl"}}

// hasSetting reports whether args (redis-server's command line) set name
// to value, as "--name value".
func hasSetting(args []string, name, value string) bool {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "--"+name && args[i+1] == value {
			return true
		}
	}
	return false
}

// The shipped configurations run Redis with the settings that keep quotas,
// and run the reconciler (meter-consumer with REDIS_ADDRS and the policy).
func TestShippedRedisKeepsQuotas(t *testing.T) {
	root := repo.Root(t)
	svcs := asMap(yamlDocs(t, filepath.Join(root, "deploy", "docker-compose.yml"))[0]["services"])
	redisSvc := asMap(svcs["redis"])
	var args []string
	for _, a := range asList(redisSvc["command"]) {
		args = append(args, asString(a))
	}
	for _, s := range quotaKeeping {
		if !hasSetting(args, s[0], s[1]) {
			t.Errorf("compose redis: --%s %s missing from %v", s[0], s[1], args)
		}
	}
	if vols := fmt.Sprint(redisSvc["volumes"]); !strings.Contains(vols, ":/data") {
		t.Errorf("compose redis: the AOF is not on a volume (%s)", vols)
	}
	for _, name := range []string{"meter-consumer", "usage-api"} {
		if env := asMap(asMap(svcs[name])["environment"]); asString(env["REDIS_ADDRS"]) == "" {
			t.Errorf("compose %s: no REDIS_ADDRS", name)
		}
	}

	up, err := os.ReadFile(filepath.Join(root, "scripts", "up.sh"))
	if err != nil {
		t.Fatal(err)
	}
	line := ""
	for _, l := range strings.SplitAfter(string(up), "\n") {
		if strings.Contains(l, "start redis redis-server") || (line != "" && strings.HasSuffix(strings.TrimSpace(line), "\\")) {
			line += l
		}
	}
	upArgs := strings.Fields(strings.ReplaceAll(line, "\\\n", " "))
	for _, s := range quotaKeeping {
		if !hasSetting(upArgs, s[0], s[1]) {
			t.Errorf("scripts/up.sh redis: --%s %s missing from %q", s[0], s[1], line)
		}
	}

	objs := k8sObjects(t)
	for _, name := range []string{"meter-consumer", "usage-api"} {
		dep := find(objs, "Deployment", name)
		if !strings.Contains(fmt.Sprint(dep), "REDIS_ADDRS") {
			t.Errorf("k8s %s: no REDIS_ADDRS", name)
		}
	}
}

// Under memory pressure, volatile-ttl evicts buckets (TTLs of seconds) and
// keeps quota counters (TTLs of up to a month); volatile-lru, the setting
// shipped before, evicts the counters written first — the quotas.
func TestVolatileTTLEvictsBucketsBeforeQuotaCounters(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		policy   string
		mustKeep bool
	}{{"volatile-ttl", true}, {"volatile-lru", false}} {
		t.Run(tc.policy, func(t *testing.T) {
			r := testenv.StartRedis(t, "--maxmemory", "3mb", "--maxmemory-policy", tc.policy)
			rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), ContextTimeoutEnabled: true})
			defer rdb.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			month := 30 * 24 * time.Hour
			const quotas = 200
			for i := 0; i < quotas; i++ {
				if err := rdb.Set(ctx, fmt.Sprintf("rl:{acct_%d}:q:tier:pro:1793491200", i), 12345, month).Err(); err != nil {
					t.Fatal(err)
				}
			}
			// Buckets, as the bucket script writes them, until Redis has
			// evicted well over the memory it has.
			bucketState := redisstore.EncodeBucket(enforcement.Bucket{Tokens: 17.25, TS: 1764410000123456})
			for i := 0; ; i++ {
				p := rdb.Pipeline()
				for j := 0; j < 500; j++ {
					k := keyslot.BucketKey("rl", fmt.Sprintf("user_%d_%d", i, j), "api:search")
					p.Set(ctx, k, bucketState, time.Duration(1+j%9)*time.Second)
				}
				if _, err := p.Exec(ctx); err != nil {
					t.Fatal(err)
				}
				info, err := rdb.Info(ctx, "stats").Result()
				if err != nil {
					t.Fatal(err)
				}
				if evicted := infoField(info, "evicted_keys"); evicted > 20000 {
					break
				}
				if i > 1000 {
					t.Fatal("no eviction after 500,000 buckets")
				}
			}
			kept := 0
			for i := 0; i < quotas; i++ {
				if n, _ := rdb.Exists(ctx, fmt.Sprintf("rl:{acct_%d}:q:tier:pro:1793491200", i)).Result(); n == 1 {
					kept++
				}
			}
			t.Logf("%s: %d of %d quota counters kept after 20,000 evictions", tc.policy, kept, quotas)
			if tc.mustKeep && kept != quotas {
				t.Errorf("%s evicted %d quota counters while buckets were there to evict", tc.policy, quotas-kept)
			}
		})
	}
}

func infoField(info, name string) int64 {
	for _, l := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(l, name+":"); ok {
			var n int64
			fmt.Sscan(v, &n)
			return n
		}
	}
	return 0
}
