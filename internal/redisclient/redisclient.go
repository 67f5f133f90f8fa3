// Package redisclient is the one place that turns the REDIS_* environment
// into a go-redis client, for every binary (limiter, meter-consumer,
// usage-api): standalone Redis, Redis Cluster or Redis Sentinel; an ACL user
// and password; TLS with a CA bundle, an optional client certificate, a
// server name and a minimum version.
//
// Rotation without a restart: the password (REDIS_PASSWORD or the file
// named by REDIS_PASSWORD_FILE) and the TLS files are re-read by
// Client.Reload, which a binary calls on SIGHUP. go-redis asks for the
// credentials (CredentialsProviderContext) and the TLS configuration (a
// Dialer of ours) each time it opens a connection, so new connections use
// what was last read; established connections stay as they are (Redis does
// not drop them when a password changes).
package redisclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/internal/tlsconf"
)

// Kinds of deployment, as Config.Kind reports them (and the limiter's
// /readyz "store" field).
const (
	KindStandalone = "redis"
	KindCluster    = "redis-cluster"
	KindSentinel   = "redis-sentinel"
)

// secrets are kept behind a pointer: a Config printed by mistake (%+v of
// a binary's whole configuration) shows an address, never the values.
type secrets struct {
	password         string // REDIS_PASSWORD or REDIS_PASSWORD_FILE, as read at start
	sentinelPassword string // REDIS_SENTINEL_PASSWORD(_FILE)
}

// Config is the connection to Redis as the environment describes it. Read
// it with FromEnv; the zero value means "no Redis" (Enabled is false).
type Config struct {
	Addrs     []string // REDIS_ADDRS: one = standalone, several = Cluster seeds, or the sentinels
	KeyPrefix string   // REDIS_KEY_PREFIX (default: FromEnv's defaultKeyPrefix), the limiters' key namespace
	Username  string   // REDIS_USERNAME: ACL user; "" = the default user

	SentinelMaster   string // REDIS_SENTINEL_MASTER: set = Addrs are sentinels
	SentinelUsername string // REDIS_SENTINEL_USERNAME: ACL user on the sentinels

	TLS      bool          // REDIS_TLS
	TLSFiles tlsconf.Files // REDIS_TLS_CA_FILE, _CERT_FILE, _KEY_FILE, _SERVER_NAME, _MIN_VERSION

	secrets   *secrets
	getenv    func(string) string
	prefix    string      // of the variables: "REDIS", or FromEnvPrefix's
	tlsConfig *tls.Config // built (and so validated) by FromEnv
}

// Format prints the configuration without its secrets, whatever the verb:
// a binary's whole configuration printed by mistake must not leak them.
func (c Config) Format(f fmt.State, _ rune) {
	fmt.Fprintf(f, "{Addrs:%v KeyPrefix:%s Username:%s SentinelMaster:%s SentinelUsername:%s TLS:%t TLSFiles:%+v Password:[redacted]}",
		c.Addrs, c.KeyPrefix, c.Username, c.SentinelMaster, c.SentinelUsername, c.TLS, c.TLSFiles)
}

// Enabled reports whether REDIS_ADDRS names any server.
func (c Config) Enabled() bool { return len(c.Addrs) > 0 }

// Kind is KindStandalone, KindCluster or KindSentinel.
func (c Config) Kind() string {
	switch {
	case c.SentinelMaster != "":
		return KindSentinel
	case len(c.Addrs) > 1:
		return KindCluster
	}
	return KindStandalone
}

// FromEnv reads every REDIS_* variable through e (problems are recorded on
// e, each naming its variable; the TLS files are read and checked now, so
// an unreadable CA or a certificate without its key stops the start).
// defaultKeyPrefix is the key prefix when REDIS_KEY_PREFIX is unset, the
// domain's (limits.DefaultKeyPrefix), passed in: a utility imports no
// domain package.
func FromEnv(e *envconfig.Reader, defaultKeyPrefix string) Config {
	return FromEnvPrefix(e, "REDIS", defaultKeyPrefix)
}

// FromEnvPrefix is FromEnv for another set of the same variables:
// prefix+"_ADDRS", prefix+"_PASSWORD", prefix+"_TLS_CA_FILE" and so on
// (the limiter's GLOBAL_REDIS_* for the home region's Redis).
func FromEnvPrefix(e *envconfig.Reader, prefix, defaultKeyPrefix string) Config {
	v := func(name string) string { return prefix + "_" + name }
	c := Config{
		Addrs:            e.List(v("ADDRS")),
		KeyPrefix:        e.String(v("KEY_PREFIX"), defaultKeyPrefix),
		Username:         e.String(v("USERNAME"), ""),
		SentinelMaster:   e.String(v("SENTINEL_MASTER"), ""),
		SentinelUsername: e.String(v("SENTINEL_USERNAME"), ""),
		secrets: &secrets{
			password:         e.Secret(v("PASSWORD")),
			sentinelPassword: e.Secret(v("SENTINEL_PASSWORD")),
		},
	}
	c.TLS, c.TLSFiles = tlsconf.FilesFromEnv(e, prefix)
	c.getenv = e.Raw // Reload re-reads the password through it
	c.prefix = prefix
	for _, a := range c.Addrs {
		e.HostPort(prefix+"_ADDRS", a)
	}
	if c.SentinelMaster != "" && len(c.Addrs) == 0 {
		e.Fail(prefix+"_SENTINEL_MASTER", "needs the sentinels' addresses in %s_ADDRS", prefix)
	}
	if c.TLS {
		var err error
		c.tlsConfig, err = tlsconf.Client(c.TLSFiles)
		tlsconf.FailEnv(e, prefix, err)
	}
	return c
}

// varSuffixes are the variables FromEnvPrefix reads, after "PREFIX_".
var varSuffixes = []string{"ADDRS", "KEY_PREFIX", "USERNAME", "SENTINEL_MASTER", "SENTINEL_USERNAME",
	"PASSWORD", "PASSWORD_FILE", "SENTINEL_PASSWORD", "SENTINEL_PASSWORD_FILE",
	"TLS", "TLS_CA_FILE", "TLS_CERT_FILE", "TLS_KEY_FILE", "TLS_SERVER_NAME", "TLS_MIN_VERSION"}

// Vars is every variable FromEnvPrefix(e, prefix) reads (the deployment
// checks compare manifests with it).
func Vars(prefix string) []string {
	out := make([]string, len(varSuffixes))
	for i, s := range varSuffixes {
		out[i] = prefix + "_" + s
	}
	return out
}

// Options are a binary's tuning of its client; zero values are go-redis's
// defaults.
type Options struct {
	Timeout      time.Duration // dialing (with the TLS handshake), each read and each write
	PoolSize     int           // connections per node
	MinIdleConns int
	MaxRetries   int // -1 = never retry (the limiter: a late answer is worth nothing)
}

// Client is a go-redis client built from a Config, with what rotation
// needs. Safe for concurrent use.
type Client struct {
	redis.UniversalClient
	kind   string
	prefix string // of the variables Reload re-reads
	creds  *credentials
	tls    *dialer // nil without TLS
	diag   diagnosis
}

// Open builds the client. It does not contact Redis: a server that is down
// at start is found out, and waited for, by the first commands.
func (c Config) Open(o Options) (*Client, error) {
	if !c.Enabled() {
		return nil, errors.New("REDIS_ADDRS is empty")
	}
	if c.TLS && c.tlsConfig == nil {
		return nil, errors.New("REDIS_TLS: the TLS configuration was not read (use FromEnv)")
	}
	if c.prefix == "" {
		c.prefix = "REDIS"
	}
	cl := &Client{kind: c.Kind(), prefix: c.prefix, creds: &credentials{user: c.Username, getenv: c.getenv}}
	if c.secrets == nil {
		c.secrets = &secrets{}
	}
	pw := c.secrets.password
	cl.creds.pw.Store(&pw)
	var dial func(ctx context.Context, network, addr string) (net.Conn, error)
	if c.TLS {
		cl.tls = &dialer{files: c.TLSFiles, timeout: o.Timeout}
		cl.tls.cfg.Store(c.tlsConfig)
		dial = cl.tls.dial
	}
	switch cl.kind {
	case KindSentinel:
		cl.UniversalClient = redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: c.SentinelMaster, SentinelAddrs: c.Addrs,
			SentinelUsername: c.SentinelUsername, SentinelPassword: c.secrets.sentinelPassword,
			CredentialsProviderContext: cl.creds.provide, Dialer: dial,
			DialTimeout: o.Timeout, ReadTimeout: o.Timeout, WriteTimeout: o.Timeout,
			ContextTimeoutEnabled: true, MaxRetries: o.MaxRetries,
			PoolSize: o.PoolSize, MinIdleConns: o.MinIdleConns,
		})
	case KindCluster:
		cl.UniversalClient = redis.NewClusterClient(&redis.ClusterOptions{
			Addrs:                      c.Addrs,
			CredentialsProviderContext: cl.creds.provide, Dialer: dial,
			DialTimeout: o.Timeout, ReadTimeout: o.Timeout, WriteTimeout: o.Timeout,
			ContextTimeoutEnabled: true, MaxRetries: o.MaxRetries,
			PoolSize: o.PoolSize, MinIdleConns: o.MinIdleConns,
		})
	default:
		cl.UniversalClient = redis.NewClient(&redis.Options{
			Addr:                       c.Addrs[0],
			CredentialsProviderContext: cl.creds.provide, Dialer: dial,
			DialTimeout: o.Timeout, ReadTimeout: o.Timeout, WriteTimeout: o.Timeout,
			ContextTimeoutEnabled: true, MaxRetries: o.MaxRetries,
			PoolSize: o.PoolSize, MinIdleConns: o.MinIdleConns,
		})
	}
	return cl, nil
}

// Kind is KindStandalone, KindCluster or KindSentinel.
func (c *Client) Kind() string { return c.kind }

// Reload re-reads the password (REDIS_PASSWORD_FILE) and, with TLS, the CA
// bundle and client certificate; connections opened from now on use them.
// On an error nothing changes (the error names the variable, never the
// secret). The sentinels' password is read at start only.
func (c *Client) Reload() error {
	pw, err := envconfig.ReadSecret(c.creds.getenv, c.prefix+"_PASSWORD")
	if err != nil {
		return err
	}
	var cfg *tls.Config
	if c.tls != nil {
		e := envconfig.New(func(string) string { return "" })
		cfg, err = tlsconf.Client(c.tls.files)
		tlsconf.FailEnv(e, c.prefix, err)
		if err := e.Err(); err != nil {
			return err
		}
	}
	c.creds.pw.Store(&pw)
	if cfg != nil {
		c.tls.cfg.Store(cfg)
	}
	return nil
}

// credentials hands go-redis the user and the latest password read.
type credentials struct {
	user   string
	pw     atomic.Pointer[string]
	getenv func(string) string
}

func (c *credentials) provide(context.Context) (string, string, error) {
	return c.user, *c.pw.Load(), nil
}

// dialer opens TLS connections with the configuration last read, so that a
// replaced CA bundle or client certificate applies without a restart.
type dialer struct {
	files   tlsconf.Files
	timeout time.Duration
	cfg     atomic.Pointer[tls.Config]
}

func (d *dialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	timeout := d.timeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	nd := net.Dialer{Timeout: timeout, KeepAlive: 5 * time.Minute}
	raw, err := nd.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	cfg := d.cfg.Load()
	if cfg.ServerName == "" {
		// As tls.Dial does: verify against the host dialed (a Cluster
		// node's announced address, a Sentinel's master address).
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		cfg = cfg.Clone()
		cfg.ServerName = host
	}
	conn := tls.Client(raw, cfg)
	hctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := conn.HandshakeContext(hctx); err != nil {
		raw.Close()
		return nil, fmt.Errorf("TLS handshake with %s: %w", addr, err)
	}
	return conn, nil
}

// Diagnose says in words why Redis does not answer a PING, or "" when it
// answers. The text names the variables to check and never contains the
// password. One PING runs at a time, under its own deadline
// (DiagnoseTimeout, or ctx's when that is later), and its answer serves
// every call for a second, so that a readiness probe polled hard does not
// open a connection per poll while Redis refuses them. A call waits for a fresh answer only until ctx ends; a PING that
// takes longer (every Cluster node down: the client retries until its
// deadline) finishes in the background and answers the next call, so a
// readiness probe is never as slow as the store it reports on.
func (c *Client) Diagnose(ctx context.Context) string {
	return c.diag.get(ctx, func(ctx context.Context) string { return c.explain(c.Ping(ctx).Err()) })
}

// Close waits for a Diagnose probe still in flight (it ends by its own
// deadline), so that no goroutine of the client outlives it, then closes
// the client.
func (c *Client) Close() error {
	c.diag.mu.Lock()
	running := c.diag.running
	c.diag.mu.Unlock()
	if running != nil {
		<-running
	}
	return c.UniversalClient.Close()
}

// DiagnoseTimeout bounds the PING of Diagnose.
const DiagnoseTimeout = time.Second

// explain is Diagnose's wording for an error a command returned.
func (c *Client) explain(err error) string {
	if err == nil {
		return ""
	}
	msg := err.Error()
	if pw := *c.creds.pw.Load(); pw != "" {
		msg = strings.ReplaceAll(msg, pw, "[redacted]") // never echoed by Redis; belt and braces
	}
	switch {
	case strings.Contains(msg, "WRONGPASS") || strings.Contains(msg, "NOAUTH") || strings.Contains(msg, "NOPERM"):
		return "Redis refused the credentials (check REDIS_USERNAME and REDIS_PASSWORD / REDIS_PASSWORD_FILE; after rotating the file, send SIGHUP): " + msg
	case strings.Contains(msg, "x509:") || strings.Contains(msg, "tls:") || strings.Contains(msg, "TLS handshake"):
		return "TLS to Redis failed (check REDIS_TLS_CA_FILE, REDIS_TLS_SERVER_NAME and the client certificate): " + msg
	case strings.Contains(msg, "connection reset") || strings.Contains(msg, "EOF") || strings.Contains(msg, "broken pipe"):
		if c.tls == nil {
			return "Redis closed the connection (a TLS-only server needs REDIS_TLS=true): " + msg
		}
		// Under TLS 1.3 the client's handshake ends before the server has
		// checked the client certificate; a server that refuses it sends
		// an alert and closes, and the first command may see the close
		// (a reset) instead of the alert.
		return "TLS to Redis failed, or Redis closed the connection right after the handshake (check the client certificate, REDIS_TLS_CERT_FILE and REDIS_TLS_KEY_FILE): " + msg
	}
	return "Redis did not answer: " + msg
}

// diagnosis runs one probe at a time and keeps its answer for a second.
type diagnosis struct {
	mu      sync.Mutex
	at      time.Time     // when the latest answer came; zero before the first
	last    string        // that answer
	running chan struct{} // closed when the probe in flight answers; nil when none is
}

// notYet is the answer while the first probe is still out.
const notYet = "Redis has not answered a PING yet (still checking)"

// get returns an answer at most a second old, starting a probe when there
// is none, and waits for a fresh one until ctx ends; then it returns the
// previous answer (notYet before the first, or when the previous one said
// Redis answered: that is no longer known).
func (d *diagnosis) get(ctx context.Context, probe func(context.Context) string) string {
	d.mu.Lock()
	if !d.at.IsZero() && time.Since(d.at) < time.Second {
		defer d.mu.Unlock()
		return d.last
	}
	if d.running == nil {
		done := make(chan struct{})
		d.running = done
		// The probe's goroutine ends by its own deadline (Close waits
		// for it); its answer is kept whoever still waits for it.
		deadline := time.Now().Add(DiagnoseTimeout)
		if ctxDeadline, ok := ctx.Deadline(); ok && ctxDeadline.After(deadline) {
			deadline = ctxDeadline
		}
		go func() {
			pctx, cancel := context.WithDeadline(context.Background(), deadline)
			why := probe(pctx)
			cancel()
			d.mu.Lock()
			d.last, d.at, d.running = why, time.Now(), nil
			d.mu.Unlock()
			close(done)
		}()
	}
	running, previous := d.running, d.last
	d.mu.Unlock()
	select {
	case <-running:
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.last
	case <-ctx.Done():
		if previous == "" {
			return notYet
		}
		return previous
	}
}
