package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Secure is how a redis-server is secured the way managed offerings are:
// TLS only (no plain-text port) with certificates from Certs, and an ACL
// user; the default user is switched off, so a client without credentials
// is refused.
type Secure struct {
	Certs    *Certs
	User     string // ACL user, with KeyPattern and every command
	Password string
	// KeyPattern limits the user's keys (an ACL pattern such as "rl:*");
	// "" = every key.
	KeyPattern string
	// ClientCerts: the server requires a client certificate signed by the
	// CA (tls-auth-clients yes); otherwise one is optional.
	ClientCerts bool
}

// args are the redis-server arguments for a TLS-only server on port.
func (s Secure) args(port int) []string {
	auth := "optional"
	if s.ClientCerts {
		auth = "yes"
	}
	keys := "~*"
	if s.KeyPattern != "" {
		keys = "~" + s.KeyPattern
	}
	return []string{
		"--port", "0",
		"--tls-port", strconv.Itoa(port),
		"--tls-cert-file", s.Certs.ServerCert,
		"--tls-key-file", s.Certs.ServerKey,
		"--tls-ca-cert-file", s.Certs.CAFile,
		"--tls-auth-clients", auth,
		"--tls-replication", "yes",
		"--user", "default", "off",
		"--user", s.User, "on", ">" + s.Password, keys, "&*", "+@all",
	}
}

// cliArgs are redis-cli's arguments to reach a server secured by s.
func (s Secure) cliArgs() []string {
	return []string{"--tls", "--cacert", s.Certs.CAFile, "--cert", s.Certs.ClientCert, "--key", s.Certs.ClientKey,
		"--user", s.User, "--pass", s.Password, "--no-auth-warning"}
}

// StartSecureRedis starts a TLS-only redis-server with an ACL user (see
// Secure) on a free loopback port; stopped at cleanup. Addr is its TLS port.
// extra are more redis-server arguments (e.g. --replicaof).
func StartSecureRedis(tb testing.TB, s Secure, extra ...string) *Redis {
	tb.Helper()
	SkipShort(tb)
	if err := checkTLSBuild(); err != nil {
		tb.Fatal(err)
	}
	dir := tb.TempDir()
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			tb.Fatal(err)
		}
		r := &Redis{Port: port, dir: dir, args: append(s.args(port), extra...), secure: &s}
		if lastErr = r.start(); lastErr == nil {
			tb.Cleanup(r.Close)
			return r
		}
	}
	tb.Fatalf("start a TLS redis-server: %v", lastErr)
	return nil
}

// CLI runs redis-cli against the server (over TLS with the ACL user when
// it is secured) and returns its trimmed output; an error reply is an
// error (redis-cli itself exits 0 on those).
func (r *Redis) CLI(ctx context.Context, args ...string) (string, error) {
	return r.cli(ctx, "", args...)
}

// cli runs redis-cli with args, or with the commands of script on its
// standard input when args is empty.
func (r *Redis) cli(ctx context.Context, script string, args ...string) (string, error) {
	full := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(r.Port)}
	if r.secure != nil {
		full = append(full, r.secure.cliArgs()...)
	}
	cmd := exec.CommandContext(ctx, "redis-cli", append(full, args...)...)
	cmd.Stdin = strings.NewReader(script)
	raw, err := cmd.CombinedOutput()
	out := strings.TrimSpace(string(raw))
	if err == nil {
		for _, line := range strings.Split(out, "\n") {
			for _, p := range []string{"ERR", "WRONGPASS", "NOAUTH", "NOPERM", "AUTH failed", "(error)"} {
				if strings.HasPrefix(line, p) {
					err = fmt.Errorf("error reply")
				}
			}
		}
	}
	if err != nil {
		return out, fmt.Errorf("redis-cli %s%s: %w: %s", strings.Join(args, " "), script, err, out)
	}
	return out, nil
}

// RotatePassword gives the ACL user the password next and closes every
// connection it has (they were authenticated with the old one): what a
// client sees when a managed service's password is rotated.
func (r *Redis) RotatePassword(ctx context.Context, next string) error {
	if r.secure == nil {
		return fmt.Errorf("redis %d has no ACL user", r.Port)
	}
	// One session: once the password has changed, redis-cli could not log
	// in again with the old one to close the connections.
	script := fmt.Sprintf("ACL SETUSER %s resetpass >%s\nCLIENT KILL USER %s SKIPME yes\n", r.secure.User, next, r.secure.User)
	if _, err := r.cli(ctx, script); err != nil {
		return err
	}
	s := *r.secure
	s.Password = next
	r.secure = &s
	return nil
}

// checkTLSBuild fails clearly when redis-server was built without TLS
// (Debian's package has it; a source build needs BUILD_TLS=yes).
func checkTLSBuild() error {
	out, err := exec.Command("redis-server", "--version").Output()
	if err != nil {
		return fmt.Errorf("redis-server --version: %w (make test installs it: scripts/deps.sh)", err)
	}
	v := string(out)
	i := strings.Index(v, "v=")
	if i < 0 {
		return fmt.Errorf("redis-server --version: unexpected %q", v)
	}
	major, _ := strconv.Atoi(strings.SplitN(v[i+2:], ".", 2)[0])
	if major < 6 {
		return fmt.Errorf("redis-server %s has no TLS or ACL (6.0 or later needed)", strings.TrimSpace(v))
	}
	return nil
}

// StartSecureCluster is StartCluster with every node secured by s: TLS on
// the client port and on the cluster bus (tls-cluster), the ACL user.
func StartSecureCluster(tb testing.TB, masters int, s Secure) *Cluster {
	tb.Helper()
	SkipShort(tb)
	if err := checkTLSBuild(); err != nil {
		tb.Fatal(err)
	}
	if masters < 3 {
		tb.Fatalf("a Redis Cluster needs at least 3 masters, got %d", masters)
	}
	dir := tb.TempDir()
	c := &Cluster{secure: &s}
	tb.Cleanup(c.Close)
	args := func(port int) []string {
		return append(append(s.args(port), "--tls-cluster", "yes"), clusterNodeArgs(port)...)
	}
	if err := c.startMasters(dir, masters, args, &s); err != nil {
		tb.Fatal(err)
	}
	if err := c.create(); err != nil {
		tb.Fatal(err)
	}
	return c
}

// Sentinels is a Redis master, its replica and three redis-sentinel
// processes watching them, on loopback. The data nodes require the ACL
// user's password (Secure without certificates: plain TCP); the sentinels
// authenticate to them with it and need none themselves.
type Sentinels struct {
	Master     string // the master name the sentinels know ("rw-master")
	Nodes      []*Redis
	Sentinels  []*Redis // redis-sentinel processes (Port = the sentinel port)
	user, pass string
	sec        *Secure // StartSecureSentinels: TLS everywhere
}

// cli is redis-cli's connection arguments for port: TLS with the test's
// client certificate when the set is secure (sentinels need no ACL user;
// data nodes get it from the caller).
func (s *Sentinels) cli(port int) []string {
	args := []string{"-p", strconv.Itoa(port)}
	if s.sec != nil {
		args = append(args, "--tls", "--cacert", s.sec.Certs.CAFile, "--cert", s.sec.Certs.ClientCert, "--key", s.sec.Certs.ClientKey)
	}
	return args
}

// Addrs are the sentinels' host:port, for REDIS_ADDRS.
func (s *Sentinels) Addrs() []string {
	out := make([]string, len(s.Sentinels))
	for i, r := range s.Sentinels {
		out[i] = r.Addr()
	}
	return out
}

// StartSentinels starts the master, one replica of it, and three sentinels
// (quorum 2) that declare the master down after downAfter without an
// answer and fail over within a few seconds more. Everything stops at
// cleanup.
func StartSentinels(tb testing.TB, user, pass string, downAfter time.Duration) *Sentinels {
	tb.Helper()
	SkipShort(tb)
	return startSentinels(tb, &Sentinels{Master: "rw-master", user: user, pass: pass}, downAfter)
}

// StartSecureSentinels is StartSentinels the way a managed offering runs it:
// the master, the replica and the three sentinels serve TLS only (sec's
// certificates; replication and the sentinels' own connections over TLS
// too), and the data nodes require sec's ACL user.
func StartSecureSentinels(tb testing.TB, sec Secure, downAfter time.Duration) *Sentinels {
	tb.Helper()
	SkipShort(tb)
	if err := checkTLSBuild(); err != nil {
		tb.Fatal(err)
	}
	return startSentinels(tb, &Sentinels{Master: "rw-master", user: sec.User, pass: sec.Password, sec: &sec}, downAfter)
}

func startSentinels(tb testing.TB, s *Sentinels, downAfter time.Duration) *Sentinels {
	tb.Helper()
	user, pass := s.user, s.pass
	// A replica (and a demoted master) authenticates to its master.
	auth := []string{"--masteruser", user, "--masterauth", pass}
	var master, replica *Redis
	if s.sec != nil {
		master = StartSecureRedis(tb, *s.sec, auth...)
		replica = StartSecureRedis(tb, *s.sec, append(auth, "--replicaof", "127.0.0.1", strconv.Itoa(master.Port))...)
	} else {
		acl := append([]string{
			"--user", "default", "off",
			"--user", user, "on", ">" + pass, "~*", "&*", "+@all",
		}, auth...)
		master = StartRedis(tb, acl...)
		replica = StartRedis(tb, append(acl, "--replicaof", "127.0.0.1", strconv.Itoa(master.Port))...)
	}
	s.Nodes = []*Redis{master, replica}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for { // the replica must be in sync before a failover can pick it
		args := append(s.cli(replica.Port), "--user", user, "--pass", pass, "--no-auth-warning", "info", "replication")
		out, _ := exec.CommandContext(ctx, "redis-cli", args...).Output()
		if strings.Contains(string(out), "master_link_status:up") {
			break
		}
		if ctx.Err() != nil {
			tb.Fatalf("replica %d never synced with master %d: %s", replica.Port, master.Port, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for i := 0; i < 3; i++ {
		s.Sentinels = append(s.Sentinels, startSentinel(tb, s.Master, master.Port, user, pass, downAfter, s.sec))
	}
	// Every sentinel must know the replica and the other sentinels before
	// it can vote in, and carry out, a failover.
	for _, sn := range s.Sentinels {
		for {
			out, _ := exec.CommandContext(ctx, "redis-cli", append(s.cli(sn.Port), "sentinel", "master", s.Master)...).Output()
			if fields := cliFields(string(out)); fields["num-slaves"] == "1" && fields["num-other-sentinels"] == "2" {
				break
			}
			if ctx.Err() != nil {
				tb.Fatalf("sentinel %d does not see the replica and the other sentinels: %s", sn.Port, out)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return s
}

func startSentinel(tb testing.TB, name string, masterPort int, user, pass string, downAfter time.Duration, sec *Secure) *Redis {
	tb.Helper()
	dir := tb.TempDir()
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			tb.Fatal(err)
		}
		conf := fmt.Sprintf("%s/sentinel-%d.conf", dir, port)
		listen := []string{"port " + strconv.Itoa(port)}
		if sec != nil {
			// TLS only; tls-replication makes the sentinel reach the data
			// nodes (and the other sentinels) over TLS as well.
			listen = []string{"port 0", "tls-port " + strconv.Itoa(port),
				"tls-cert-file " + sec.Certs.ServerCert, "tls-key-file " + sec.Certs.ServerKey,
				"tls-ca-cert-file " + sec.Certs.CAFile, "tls-auth-clients optional", "tls-replication yes"}
		}
		body := strings.Join(append(listen,
			"bind 127.0.0.1",
			"protected-mode no",
			"daemonize no",
			"loglevel warning",
			"dir "+dir,
			fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 2", name, masterPort),
			fmt.Sprintf("sentinel auth-user %s %s", name, user),
			fmt.Sprintf("sentinel auth-pass %s %s", name, pass),
			fmt.Sprintf("sentinel down-after-milliseconds %s %d", name, downAfter.Milliseconds()),
			fmt.Sprintf("sentinel failover-timeout %s %d", name, 4*downAfter.Milliseconds()),
			fmt.Sprintf("sentinel parallel-syncs %s 1", name),
		), "\n") + "\n"
		if err := writeFile(conf, body); err != nil {
			tb.Fatal(err)
		}
		logPath := fmt.Sprintf("%s/sentinel-%d.log", dir, port)
		p, err := startProcess("redis-sentinel", logPath, "redis-sentinel", conf)
		if err != nil {
			tb.Fatal(err)
		}
		r := &Redis{Port: port, dir: dir, proc: p}
		if lastErr = waitTCP(r.Addr(), 10*time.Second); lastErr != nil {
			p.Kill()
			continue
		}
		tb.Cleanup(r.Close)
		return r
	}
	tb.Fatalf("start redis-sentinel: %v", lastErr)
	return nil
}

// MasterPort asks the first live sentinel which port the master is on now.
func (s *Sentinels) MasterPort(ctx context.Context) (int, error) {
	var last error
	for _, sn := range s.Sentinels {
		out, err := exec.CommandContext(ctx, "redis-cli", append(s.cli(sn.Port), "sentinel",
			"get-master-addr-by-name", s.Master)...).Output()
		if err != nil {
			last = err
			continue
		}
		lines := strings.Fields(string(out))
		if len(lines) != 2 {
			last = fmt.Errorf("sentinel %d: %q", sn.Port, out)
			continue
		}
		return strconv.Atoi(lines[1])
	}
	return 0, last
}

func writeFile(path, body string) error { return os.WriteFile(path, []byte(body), 0o600) }

// cliFields reads redis-cli's alternating name/value lines.
func cliFields(out string) map[string]string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	m := map[string]string{}
	for i := 0; i+1 < len(lines); i += 2 {
		m[strings.TrimSpace(lines[i])] = strings.TrimSpace(lines[i+1])
	}
	return m
}

// SecureRedisEnv starts a Redis the way a managed one is reached (TLS
// only, client certificates required, an ACL user limited to the
// limiters' "rl:*" keys) and returns the REDIS_* variables a binary
// connects to it with, the password given as a file, and the password,
// which the test checks is never printed.
func SecureRedisEnv(tb testing.TB) (env map[string]string, password string) {
	tb.Helper()
	SkipShort(tb)
	const pw = "rw-redis-pw-71c04e9a5d3b"
	certs := NewCerts(tb)
	r := StartSecureRedis(tb, Secure{Certs: certs, User: "ratewarden", Password: pw, KeyPattern: "rl:*", ClientCerts: true})
	pwFile := tb.TempDir() + "/redis-password"
	if err := os.WriteFile(pwFile, []byte(pw+"\n"), 0o600); err != nil {
		tb.Fatal(err)
	}
	return map[string]string{
		"REDIS_ADDRS":         r.Addr(),
		"REDIS_USERNAME":      "ratewarden",
		"REDIS_PASSWORD_FILE": pwFile,
		"REDIS_TLS":           "true",
		"REDIS_TLS_CA_FILE":   certs.CAFile,
		"REDIS_TLS_CERT_FILE": certs.ClientCert,
		"REDIS_TLS_KEY_FILE":  certs.ClientKey,
	}, pw
}

// ScriptingRedis is what ExpectSecureRedisWorks needs of a binary's Redis
// client (internal/redisclient's Client is one).
type ScriptingRedis interface {
	Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd
	Diagnose(ctx context.Context) string
}

// ExpectSecureRedisWorks runs a script through rdb as the ACL user of
// SecureRedisEnv, as the binaries' own Redis work does, and expects
// Diagnose to find nothing wrong.
func ExpectSecureRedisWorks(tb testing.TB, rdb ScriptingRedis) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n, err := rdb.Eval(ctx, "return redis.call('INCRBY', KEYS[1], ARGV[1])", []string{"rl:{acct}:q:test"}, 3).Int64()
	if err != nil || n != 3 {
		tb.Fatalf("EVAL over TLS as the ACL user: %d %v", n, err)
	}
	if why := rdb.Diagnose(ctx); why != "" {
		tb.Fatalf("Diagnose: %s", why)
	}
}
