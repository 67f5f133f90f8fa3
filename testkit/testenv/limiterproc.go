package testenv

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Limiter is a limiter process started by the harness.
type Limiter struct {
	// URL is its HTTP address, http://127.0.0.1:port.
	URL     string
	Name    string
	LogPath string
	proc    *Process
}

// limiterClient is every harness call to a limiter: short deadlines, many
// connections kept open (the tests send from several goroutines).
var limiterClient = &http.Client{
	Timeout:   5 * time.Second,
	Transport: &http.Transport{MaxIdleConnsPerHost: 64},
}

// StartLimiterProcess runs bin with env (on top of the test's environment
// and a free LIMITER_ADDR), its output in logPath, and waits until it
// answers /healthz. The caller stops it (Stop or Kill).
func StartLimiterProcess(name, bin, logPath string, env []string) (*Limiter, error) {
	return StartServiceProcess(name, bin, logPath, "LIMITER_ADDR", "/healthz", env)
}

// StartServiceProcess is StartLimiterProcess for any of the project's
// binaries that serve HTTP (meter-consumer: METER_ADDR, usage-api:
// USAGE_API_ADDR): a free loopback address in addrVar, and it waits until
// ready answers 200. The returned Limiter's Stop, Kill, LogTail and Metric
// serve any such process.
func StartServiceProcess(name, bin, logPath, addrVar, ready string, env []string) (*Limiter, error) {
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		l := &Limiter{URL: "http://127.0.0.1:" + strconv.Itoa(port), Name: name, LogPath: logPath}
		f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(bin)
		cmd.Env = append(append(os.Environ(), addrVar+"=127.0.0.1:"+strconv.Itoa(port)), env...)
		cmd.Stdout, cmd.Stderr = f, f
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			f.Close()
			return nil, fmt.Errorf("start %s: %w", name, err)
		}
		f.Close()
		p := &Process{Name: name, cmd: cmd, done: make(chan struct{})}
		go func() {
			p.err = cmd.Wait()
			close(p.done)
		}()
		l.proc = p
		if lastErr = l.waitReady(ready, 60*time.Second); lastErr == nil {
			return l, nil
		}
		p.Kill()
		if !strings.Contains(lastErr.Error(), "address already in use") {
			break
		}
	}
	return nil, lastErr
}

func (l *Limiter) waitReady(path string, within time.Duration) error {
	deadline := time.Now().Add(Timeout(within))
	for {
		resp, err := limiterClient.Get(l.URL + path)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("GET %s: %d", path, resp.StatusCode)
		}
		if l.proc.Exited() {
			return fmt.Errorf("%s exited at start: %s", l.Name, l.LogTail(20))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %s: %v; %s", l.Name, within, err, l.LogTail(20))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Process is the running limiter (Kill, Signal(SIGSTOP), ...).
func (l *Limiter) Process() *Process { return l.proc }

// Stop ends the limiter with SIGTERM, and SIGKILL after grace.
func (l *Limiter) Stop(grace time.Duration) { l.proc.Stop(grace) }

// Kill ends the limiter with SIGKILL: a crash, nothing handed back.
func (l *Limiter) Kill() { l.proc.Kill() }

// LogTail is the last n lines of the limiter's output.
func (l *Limiter) LogTail(n int) string {
	b, _ := os.ReadFile(l.LogPath)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Decision is the part of a /check answer the harness's callers read.
type Decision struct {
	Allowed   bool   `json:"allowed"`
	Remaining int64  `json:"remaining"`
	Limit     int64  `json:"limit"`
	Source    string `json:"source"`
	Policy    string `json:"policy"`
}

// Check posts one /check (cost 1 when cost is 0) and returns the decision;
// an error for no answer or a status other than 200.
func (l *Limiter) Check(key, scope string, cost int) (Decision, error) {
	if cost == 0 {
		cost = 1
	}
	body := fmt.Sprintf(`{"key":%q,"scope":%q,"cost":%d}`, key, scope, cost)
	resp, err := limiterClient.Post(l.URL+"/check", "application/json", strings.NewReader(body))
	if err != nil {
		return Decision{}, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return Decision{}, fmt.Errorf("POST /check: %d %s", resp.StatusCode, b)
	}
	var d Decision
	if err := json.Unmarshal(b, &d); err != nil {
		return Decision{}, fmt.Errorf("POST /check: %q: %w", b, err)
	}
	return d, nil
}

// Readyz returns /readyz's JSON body and HTTP status.
func (l *Limiter) Readyz() (map[string]any, int, error) {
	resp, err := limiterClient.Get(l.URL + "/readyz")
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	var body map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, resp.StatusCode, fmt.Errorf("GET /readyz: %w", err)
	}
	return body, resp.StatusCode, nil
}

// Metric is the sum of the samples of /metrics whose line starts with
// prefix (a name, with labels if wanted).
func (l *Limiter) Metric(prefix string) (float64, error) {
	resp, err := limiterClient.Get(l.URL + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, prefix) {
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err == nil {
				sum += v
			}
		}
	}
	return sum, sc.Err()
}
