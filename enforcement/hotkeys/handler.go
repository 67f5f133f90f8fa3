package hotkeys

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/enforcement/keyname"
)

// Handler serves GET /admin/hot-keys?limit=N (default 10, at most the
// tracker's capacity): the Snapshot as JSON, each key beside its name in
// the metrics (metricKey, by names), so that an operator can map a
// series to its key. It shows raw keys and does no authentication: mount
// it behind the operator's token.
func Handler(t *Tracker, names keyname.Namer) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", http.MethodGet)
			http.Error(w, `{"error":{"code":"method_not_allowed","message":"use GET"}}`, http.StatusMethodNotAllowed)
			return
		}
		n := 10
		if s := r.URL.Query().Get("limit"); s != "" {
			v, err := strconv.Atoi(s)
			if err != nil || v < 1 || v > t.cfg.Capacity*t.cfg.Shards {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusBadRequest)
				_, _ = w.Write([]byte(`{"error":{"code":"invalid_request","message":"limit must be an integer between 1 and ` +
					strconv.Itoa(t.cfg.Capacity*t.cfg.Shards) + `"}}` + "\n"))
				return
			}
			n = v
		}
		snap := t.Snapshot(n)
		if snap.Keys == nil {
			snap.Keys = []KeyRate{}
		}
		for i := range snap.Keys {
			snap.Keys[i].MetricKey = names.Name(snap.Keys[i].Key)
		}
		if snap.Shards == nil {
			snap.Shards = []ShardRate{}
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(snap)
	})
}

// Collector exports the top 10 keys and every shard as Prometheus gauges:
//
//	limiter_hot_key_ops_per_second{rank="1",key="...",scope="..."}
//	limiter_hot_key_shared_ops_per_second{rank,key,scope}
//	limiter_shard_ops_per_second{shard="..."}
//
// The key label is the key's name (keyname: a keyed hash unless the
// operator chose raw keys), never the key itself by default. Each scrape
// emits at most TopN key series (ranks 1..TopN), so the label cardinality
// is bounded however many keys there are; a key that leaves the top 10
// simply stops being reported.
type Collector struct {
	t     *Tracker
	names keyname.Namer
	topN  int
	key   *prometheus.Desc
	kSh   *prometheus.Desc
	shd   *prometheus.Desc
}

// NewCollector returns a collector of the top 10 keys of t, each named by
// names; register it on the limiter's registry.
func NewCollector(t *Tracker, names keyname.Namer) *Collector {
	what := "key is a keyed hash of the key (GET /admin/hot-keys maps it to the key)"
	if names.IsRaw() {
		what = "key is the raw key"
	}
	return &Collector{
		t:     t,
		names: names,
		topN:  10,
		key: prometheus.NewDesc("limiter_hot_key_ops_per_second",
			"Decisions per second of the 10 hottest (key, scope) pairs on this instance (space-saving top-K; rank 1 is the hottest; "+what+").",
			[]string{"rank", "key", "scope"}, nil),
		kSh: prometheus.NewDesc("limiter_hot_key_shared_ops_per_second",
			"Of limiter_hot_key_ops_per_second, decisions answered by the shared tier.",
			[]string{"rank", "key", "scope"}, nil),
		shd: prometheus.NewDesc("limiter_shard_ops_per_second",
			"Decisions per second on this instance by the Redis shard that holds the key's slot.",
			[]string{"shard"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.key
	ch <- c.kSh
	ch <- c.shd
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	snap := c.t.Snapshot(c.topN)
	for i, k := range snap.Keys {
		rank, name := strconv.Itoa(i+1), c.names.Name(k.Key)
		ch <- prometheus.MustNewConstMetric(c.key, prometheus.GaugeValue, k.OpsPerSecond, rank, name, k.Scope)
		ch <- prometheus.MustNewConstMetric(c.kSh, prometheus.GaugeValue, k.SharedOpsPerSecond, rank, name, k.Scope)
	}
	for _, s := range snap.Shards {
		ch <- prometheus.MustNewConstMetric(c.shd, prometheus.GaugeValue, s.OpsPerSecond, s.Shard)
	}
}
