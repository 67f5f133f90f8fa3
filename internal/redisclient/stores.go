package redisclient

import (
	"sort"
	"strings"

	"github.com/ratewarden/ratewarden/internal/envconfig"
)

// NamedStore is one entry of REDIS_STORES (dedicated capacity beside the
// default store): its name and its connection, every REDIS_* variable of
// the default store but the addresses.
type NamedStore struct {
	Name  string
	Redis Config
}

// ParseStores reads REDIS_STORES, `NAME=ADDR[,ADDR…][;NAME=…]`, calling
// fail for each problem. validName is the domain's rule for a store's
// name (limits.ValidStoreName), passed in: a utility imports no domain
// package.
func ParseStores(v string, validName func(string) bool, fail func(format string, args ...any)) map[string][]string {
	out := map[string][]string{}
	for _, entry := range strings.Split(v, ";") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		name, addrs, ok := strings.Cut(entry, "=")
		name = strings.TrimSpace(name)
		switch {
		case !ok:
			fail("%q is not NAME=ADDR[,ADDR…]", entry)
			continue
		case !validName(name):
			fail("%q is not a store name (letters, digits, '_' and '-'; not the default store's)", name)
			continue
		case out[name] != nil:
			fail("store %q is named twice", name)
			continue
		}
		var list []string
		for _, a := range strings.Split(addrs, ",") {
			if a = strings.TrimSpace(a); a != "" {
				list = append(list, a)
			}
		}
		if len(list) == 0 {
			fail("store %q has no address", name)
			continue
		}
		out[name] = list
	}
	return out
}

// StoresOfEnv parses REDIS_STORES for the operator's commands (policy
// check, explain, push): the names and addresses, or every problem, each
// naming the variable, as the limiter itself would refuse them at start.
func StoresOfEnv(getenv func(string) string, validName func(string) bool) (map[string][]string, error) {
	e := envconfig.New(getenv)
	const name = "REDIS_STORES"
	stores := ParseStores(e.Raw(name), validName, func(format string, args ...any) { e.Fail(name, format, args...) })
	return stores, e.Err()
}

// StoresFromEnv reads REDIS_STORES through e; each store is reached as
// the default one def is (TLS, ACL user, password), at its own
// addresses: one standalone, several a Cluster. They come sorted by name.
func StoresFromEnv(e *envconfig.Reader, def Config, validName func(string) bool) []NamedStore {
	const name = "REDIS_STORES"
	byName := ParseStores(e.Raw(name), validName, func(format string, args ...any) { e.Fail(name, format, args...) })
	if len(byName) > 0 && !def.Enabled() {
		e.Fail(name, "needs REDIS_ADDRS: the default store is the one every key not routed elsewhere uses")
	}
	var out []NamedStore
	for n, addrs := range byName {
		for _, a := range addrs {
			e.HostPort(name, a)
		}
		c := def
		c.Addrs, c.SentinelMaster, c.SentinelUsername = addrs, "", ""
		out = append(out, NamedStore{Name: n, Redis: c})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
