package slots_test

import (
	"log"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/httpapi"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/enforcement/slots"
	"github.com/ratewarden/ratewarden/policy"
)

// An embedded limiter whose policy has concurrency limits: the Gate in
// front of it takes a slot for each request the middleware lets through,
// renews it while the handler runs and gives it back when it returns.
func ExampleGate() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	pol, err := policy.Parse([]byte(`version: 1
default_tier: reports
priorities: { critical: 1, default: 0.8, sheddable: 0.5 }
tiers:
  reports: { concurrency: 20 }
`))
	if err != nil {
		log.Fatal(err)
	}
	lim, err := enforcement.New(enforcement.Config{Authority: redisstore.New(rdb, ""), Policy: pol})
	if err != nil {
		log.Fatal(err)
	}
	gate, err := slots.NewGate(slots.Config{
		Next: lim, Policy: lim.Policy,
		Store: redisstore.NewConcurrency(rdb, ""),
		TTL:   10 * time.Second, // renewed every 3.3 s while a handler runs
	})
	if err != nil {
		log.Fatal(err)
	}
	guard := &httpapi.Guard{Checker: gate, Key: httpapi.HeaderKey("X-API-Key", "key:")}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /reports/{id}", func(w http.ResponseWriter, r *http.Request) {
		// At most 20 of these run at once per key across every instance;
		// r.Context() ends with httpapi.ErrLeaseLost if the slot is lost.
	})
	log.Fatal(http.ListenAndServe(":8080", httpapi.Middleware(guard)(mux)))
}
