package main

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// distinctive is a secret no log line, path or metric could hold by chance.
func distinctive(what string) string {
	b := make([]byte, 10)
	_, _ = rand.Read(b)
	return "S3CR3T-" + what + "-" + hex.EncodeToString(b)
}

// startAlive runs one of the binaries and waits until /healthz answers or
// the process has exited (a start-up error is part of what is scanned).
func startAlive(t *testing.T, name, addrVar string, env ...string) *proc {
	t.Helper()
	testenv.SkipShort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	cmd := exec.Command(filepath.Join(bins, name))
	cmd.Env = append(append(os.Environ(), addrVar+"="+addr), env...)
	p := &proc{name: name, url: "http://" + addr, cmd: cmd, logs: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.logs, p.logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s logs:\n%s", name, tail(p.logs.String(), 4000))
		}
	})
	eventually(t, time.Minute, name+" never answered /healthz nor exited", func() bool {
		select {
		case <-p.done:
			return true
		default:
		}
		code, _ := get(p.url + "/healthz")
		return code == 200
	})
	return p
}

// get is a GET that returns 0 when nothing answers.
func get(u string) (int, string) {
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(u)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestNoSecretInLogsReadyzOrMetrics starts every binary against secure
// backends (Kafka SASL_SSL, ClickHouse on its secure port with a password,
// Redis with requirepass) with distinctive secrets: first with a WRONG
// password for every backend, so that every error path logs and /readyz
// reports, then with the right ones and some traffic (including a request
// with a wrong bearer token); it scans every process's output, /readyz and
// /metrics, and the output after SIGTERM, for every secret configured,
// right or wrong.
func TestNoSecretInLogsReadyzOrMetrics(t *testing.T) {
	t.Parallel()
	ch := testenv.StartSecureClickHouse(t)
	db := ch.Database(t)
	k := testenv.StartSecureKafka(t, "ratelimit.decisions", 2)
	redisPW := distinctive("redis")
	rd := testenv.StartRedis(t, "--requirepass", redisPW)
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policy, []byte(e2ePolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	wrongKafka, wrongCH, wrongRedis := distinctive("kafka-wrong"), distinctive("ch-wrong"), distinctive("redis-wrong")
	limiterToken, adminToken, tokenSecret := distinctive("limiter-token"), distinctive("admin-token"), distinctive("token-secret")
	hook := make([]byte, 24)
	_, _ = rand.Read(hook)
	webhookRaw := base64.StdEncoding.EncodeToString(hook)
	secrets := map[string]string{
		"KAFKA_SASL_PASSWORD": k.Password, "wrong KAFKA_SASL_PASSWORD": wrongKafka,
		"CLICKHOUSE_PASSWORD": ch.Password, "wrong CLICKHOUSE_PASSWORD": wrongCH,
		"REDIS_PASSWORD": redisPW, "wrong REDIS_PASSWORD": wrongRedis,
		"LIMITER_AUTH_TOKEN": limiterToken, "USAGE_ADMIN_TOKEN": adminToken, "USAGE_TOKEN_SECRET": tokenSecret,
		"WEBHOOK_SECRET": "whsec_" + webhookRaw, "WEBHOOK_SECRET's key": webhookRaw,
	}
	hookURL := fmt.Sprintf("http://127.0.0.1:%d/hook", testenv.FreePort(t)) // nothing listens: deliveries fail and log
	env := func(kafkaPWFile, chPWFile, redisPassword string) (limiter, meter, api []string) {
		common := []string{"CLICKHOUSE_DATABASE=" + db, "POLICY_FILE=" + policy, "REDIS_ADDRS=" + rd.Addr(), "REDIS_PASSWORD=" + redisPassword}
		limiter = append(append(append([]string{}, common...), k.Env("scram-sha-512", kafkaPWFile)...),
			"LIMITER_AUTH_TOKEN="+limiterToken, "LIMITER_KAFKA_CHECK_EVERY=300ms", "LIMITER_GRPC_ADDR=")
		meter = append(append(append(append([]string{}, common...), k.Env("scram-sha-256", kafkaPWFile)...), ch.Env(chPWFile)...),
			"WEBHOOK_URL="+hookURL, "WEBHOOK_SECRET=whsec_"+webhookRaw, "METER_BATCH_WAIT=50ms",
			"METER_KAFKA_CHECK_EVERY=300ms", "METER_RECONCILE_EVERY=200ms")
		api = append(append(append([]string{}, common...), ch.Env(chPWFile)...),
			"USAGE_ADMIN_TOKEN="+adminToken, "USAGE_TOKEN_SECRET="+tokenSecret)
		return
	}
	scan := func(phase string, procs ...*proc) {
		t.Helper()
		for _, p := range procs {
			texts := map[string]string{"output": p.logs.String()}
			select {
			case <-p.done:
			default:
				_, texts["/readyz"] = get(p.url + "/readyz")
				_, texts["/metrics"] = get(p.url + "/metrics")
			}
			for where, text := range texts {
				if text == "" {
					t.Errorf("%s: %s's %s is empty: nothing was scanned", phase, p.name, where)
				}
				for name, s := range secrets {
					if strings.Contains(text, s) {
						t.Errorf("%s: %s's %s holds %s", phase, p.name, where, name)
					}
				}
			}
		}
	}
	stopAll := func(procs ...*proc) {
		for _, p := range procs {
			select {
			case <-p.done:
			default:
				_ = p.cmd.Process.Signal(syscall.SIGTERM)
				select {
				case <-p.done:
				case <-time.After(testenv.Timeout(15 * time.Second)):
					t.Errorf("%s did not stop within 15 s of SIGTERM", p.name)
					_ = p.cmd.Process.Kill()
					<-p.done
				}
			}
		}
	}
	call401 := func(u, token string) {
		if code, _ := call(t, "GET", u, token, ""); code != 401 {
			t.Errorf("GET %s with a wrong token: %d, want 401", u, code)
		}
	}

	// Phase 1: every backend password wrong.
	lEnv, mEnv, aEnv := env(file("kafka-wrong", wrongKafka), file("ch-wrong", wrongCH), wrongRedis)
	limiter := startAlive(t, "limiter", "LIMITER_ADDR", lEnv...)
	meter := startAlive(t, "meter-consumer", "METER_ADDR", mEnv...)
	api := startAlive(t, "usage-api", "USAGE_API_ADDR", aEnv...)
	eventually(t, time.Minute, "meter-consumer never reported both refused logins", func() bool {
		code, body := get(meter.url + "/readyz")
		return code == 503 && strings.Contains(body, "refused SASL") && strings.Contains(body, "refused the login")
	})
	eventually(t, time.Minute, "usage-api never reported the refused login", func() bool {
		code, body := get(api.url + "/readyz")
		return code == 503 && strings.Contains(body, "refused the login")
	})
	eventually(t, time.Minute, "limiter never reported the refused Kafka login", func() bool {
		_, body := get(limiter.url + "/readyz")
		return strings.Contains(body, "refused SASL")
	})
	for i := 0; i < 5; i++ {
		call(t, "POST", limiter.url+"/check", limiterToken, `{"key":"acct_scan","scope":"api:read"}`)
	}
	call(t, "POST", limiter.url+"/check", "not-the-token", `{"key":"acct_scan","scope":"api:read"}`)
	call401(api.url+"/v1/usage?key=acct_scan", "not-the-admin-token")
	call(t, "GET", api.url+"/v1/admin/top-keys", adminToken, "")
	scan("wrong passwords", limiter, meter, api)
	stopAll(limiter, meter, api)
	scan("wrong passwords, after SIGTERM", limiter, meter, api)

	// Phase 2: the right passwords, and traffic end to end.
	lEnv, mEnv, aEnv = env(k.PasswordFile, ch.PasswordFile, redisPW)
	limiter = startAlive(t, "limiter", "LIMITER_ADDR", lEnv...)
	meter = startAlive(t, "meter-consumer", "METER_ADDR", mEnv...)
	api = startAlive(t, "usage-api", "USAGE_API_ADDR", aEnv...)
	for _, p := range []*proc{meter, api} {
		eventually(t, 2*time.Minute, p.name+" never became ready", func() bool {
			code, _ := get(p.url + "/readyz")
			return code == 200
		})
	}
	q := url.Values{"key": {"acct_scan2"}, "window": {"day"},
		"from": {time.Now().UTC().Add(-48 * time.Hour).Format(time.RFC3339)}, "to": {time.Now().UTC().Add(48 * time.Hour).Format(time.RFC3339)}}
	eventually(t, 2*time.Minute, "decisions never reached the usage API", func() bool {
		call(t, "POST", limiter.url+"/check", limiterToken, `{"key":"acct_scan2","scope":"api:read"}`)
		_, b := call(t, "GET", api.url+"/v1/usage?"+q.Encode(), adminToken, "")
		return strings.Contains(string(b), `"requests":`)
	})
	call(t, "POST", limiter.url+"/check", "not-the-token", `{"key":"acct_scan2","scope":"api:read"}`)
	call401(api.url+"/v1/usage?key=acct_scan2", "not-the-admin-token")
	if code, b := call(t, "POST", api.url+"/v1/admin/portal-tokens", adminToken, `{"key":"acct_scan2","ttl_seconds":60}`); code != 201 {
		t.Fatalf("portal token: %d %s", code, b)
	}
	scan("right passwords", limiter, meter, api)
	stopAll(limiter, meter, api)
	scan("right passwords, after SIGTERM", limiter, meter, api)
}
