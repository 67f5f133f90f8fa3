package notify

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"sync/atomic"
	"time"

	"gopkg.in/yaml.v3"
)

// Endpoint is where one key's notifications go.
type Endpoint struct {
	URL string
	Key []byte // HMAC key (decoded secret)
}

// endpointsFile is the per-key endpoints file (WEBHOOK_ENDPOINTS_FILE):
//
//	endpoints:
//	  acct_8812: { url: "https://hooks.example.com/ratelimit", secret: "whsec_..." }
//
// A key without an entry uses the default endpoint (WEBHOOK_URL and
// WEBHOOK_SECRET); an entry without secret uses the default secret.
type endpointsFile struct {
	Endpoints map[string]struct {
		URL    string `yaml:"url"`
		Secret string `yaml:"secret"`
	} `yaml:"endpoints"`
}

// CheckURL is the rule for a webhook endpoint's address: an absolute
// http(s) URL with a host.
func CheckURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q is not an http(s) URL", s)
	}
	return nil
}

// parseEndpoints validates a per-key endpoints document.
func parseEndpoints(b []byte, defaultKey []byte) (map[string]Endpoint, error) {
	var f endpointsFile
	if err := yaml.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("endpoints file: %w", err)
	}
	out := make(map[string]Endpoint, len(f.Endpoints))
	var errs []error
	for key, e := range f.Endpoints {
		if err := CheckURL(e.URL); err != nil {
			errs = append(errs, fmt.Errorf("endpoint of %q: %w", key, err))
			continue
		}
		ep := Endpoint{URL: e.URL, Key: defaultKey}
		if e.Secret != "" {
			k, err := ParseSecret(e.Secret)
			if err != nil {
				errs = append(errs, fmt.Errorf("endpoint of %q: %w", key, err))
				continue
			}
			ep.Key = k
		}
		if ep.Key == nil {
			errs = append(errs, fmt.Errorf("endpoint of %q: no secret and no default WEBHOOK_SECRET", key))
			continue
		}
		out[key] = ep
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("endpoints file: %w", err)
	}
	return out, nil
}

// endpoints resolves a key's endpoint: the per-key file (re-read when it
// changes; a file that fails validation is logged and the previous content
// stays), else the default. Lookups are lock-free.
type endpoints struct {
	def   Endpoint // URL "" = no default
	path  string
	log   *slog.Logger
	table atomic.Pointer[map[string]Endpoint]
	stamp struct {
		mod  time.Time
		size int64
	}
	reloadErrors atomic.Int64
}

func (e *endpoints) lookup(key string) (Endpoint, bool) {
	if t := e.table.Load(); t != nil {
		if ep, ok := (*t)[key]; ok {
			return ep, true
		}
	}
	return e.def, e.def.URL != ""
}

// reload re-reads the file if it changed. Only the owner goroutine calls it.
func (e *endpoints) reload() error {
	if e.path == "" {
		return nil
	}
	st, err := os.Stat(e.path)
	if err != nil {
		return fmt.Errorf("endpoints file: %w", err)
	}
	if st.ModTime().Equal(e.stamp.mod) && st.Size() == e.stamp.size && e.table.Load() != nil {
		return nil
	}
	b, err := os.ReadFile(e.path)
	if err != nil {
		return fmt.Errorf("endpoints file: %w", err)
	}
	t, err := parseEndpoints(b, e.def.Key)
	if err != nil {
		return err
	}
	e.stamp.mod, e.stamp.size = st.ModTime(), st.Size()
	e.table.Store(&t)
	e.log.Info("webhook endpoints loaded", "path", e.path, "keys", len(t))
	return nil
}
