package policyctl

// A writer is told "applied" only for a record the fleet applies. The
// CLI reads its own record back with the follower's apply rule, but two
// facts the rule depends on may be the fleet's alone: its keyring
// (POLICY_TRUSTED_KEYS_FILE: a limiter with one refuses every record not
// signed by a key in it) and the revision it holds (a log that lost its
// records restarts at revision 1 while the fleet keeps the revision in
// force until a restore). So a write checks, before it writes:
//
//   - the writer's own environment: with a keyring
//     (POLICY_TRUSTED_KEYS_FILE, the fleet's trust as the operator
//     describes it) and no signing key, an unsigned write is refused
//     (unauthenticated): a reader with that keyring refuses it;
//   - the log: once a signed record is in force, an unsigned write is
//     refused (unauthenticated): a fleet that trusts only signed records
//     would refuse it, and a fleet that trusts any would not need the
//     signature the log's writers give;
//   - the fleet, when LIMITER_FLEET_URLS names it: a limiter that trusts
//     only signed records refuses an unsigned write; one that holds a
//     revision the log does not (the log lost or replaced) refuses every
//     write until a restore;
//
// and after it, with LIMITER_FLEET_URLS, waits until every limiter that
// answers reports the new revision (or one refuses it) before it says
// "applied".

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/ratewarden/ratewarden/policylog"
)

// fleetConfirmWait bounds how long a write waits for the fleet to report
// its revision: the fleet applies a push within a second
// (docs/policy-log.md); the rest is room for a busy machine.
const fleetConfirmWait = 15 * time.Second

// writeGate is a write's check of the fleet's trust and state, before
// and after it writes.
type writeGate struct {
	keys policylog.Keys
	urls []string // LIMITER_FLEET_URLS; empty = the fleet is not asked
	hc   *http.Client
}

func newWriteGate(keys policylog.Keys, getenv func(string) string) *writeGate {
	var urls []string
	for _, u := range strings.Split(getenv("LIMITER_FLEET_URLS"), ",") {
		if u = strings.TrimSpace(u); u != "" {
			urls = append(urls, strings.TrimSuffix(u, "/"))
		}
	}
	return &writeGate{keys: keys, urls: urls, hc: &http.Client{Timeout: 5 * time.Second}}
}

// limiterPolicy is what one limiter says of its policy (/readyz).
func (g *writeGate) limiterPolicy(ctx context.Context, url string) (policylog.Info, error) {
	var body struct{ Policy policylog.Info }
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/readyz", nil)
	if err != nil {
		return body.Policy, err
	}
	resp, err := g.hc.Do(req)
	if err != nil {
		return body.Policy, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&body); err != nil {
		return body.Policy, fmt.Errorf("%s/readyz: %w", url, err)
	}
	return body.Policy, nil
}

// before returns a refusal (code, reason) when the write must not be
// made; code is "" when it may.
func (g *writeGate) before(ctx context.Context, st *policylog.State) (code, reason string) {
	signs := g.keys.Signer != nil
	if !signs && g.keys.Ring != nil {
		return policylog.CodeUnauthenticated, "POLICY_TRUSTED_KEYS_FILE names a keyring, so readers with it trust only signed records, and this write would not be signed:\n" +
			"set POLICY_SIGNING_KEY_FILE to a key of that keyring"
	}
	if _, doc := st.Document(); !signs && doc.Sig != "" {
		return policylog.CodeUnauthenticated, fmt.Sprintf("the policy in force (revision %d) is signed by a writer's key, and this write would not be:\n"+
			"readers that trust only signed records (POLICY_TRUSTED_KEYS_FILE) refuse it; set POLICY_SIGNING_KEY_FILE to a key of their keyring", st.Head())
	}
	for _, u := range g.urls {
		info, err := g.limiterPolicy(ctx, u)
		if err != nil {
			continue // a limiter that is down applies the log's rule when it is back; after the write, one that answers must confirm
		}
		if info.Signed && !signs {
			return policylog.CodeUnauthenticated, fmt.Sprintf("limiter %s trusts only signed records (POLICY_TRUSTED_KEYS_FILE), and this write would not be signed:\n"+
				"set POLICY_SIGNING_KEY_FILE to a key of its keyring", u)
		}
		if why := aheadOfLog(info, st); why != "" {
			return codeLostLog, fmt.Sprintf("limiter %s %s:\nthe log was lost or replaced; `limiter policy restore` writes the fleet's state back first (docs/policy-log-recovery.md)", u, why)
		}
	}
	return "", ""
}

// codeLostLog is the refusal of a write onto a log the fleet is ahead of.
const codeLostLog = "lost_log"

// aheadOfLog says why a limiter holds what the log does not (its revision
// in force is not in the log read), or "".
func aheadOfLog(info policylog.Info, st *policylog.State) string {
	switch {
	case info.Source != policylog.SourceKafka && info.Source != policylog.SourceCache:
		return "" // the bootstrap file or file mode: nothing of the log held
	case info.Status == policylog.StatusStale:
		return "refuses the log as it is (" + info.LogError + ")"
	case info.Epoch > st.Epoch() || (info.Epoch == st.Epoch() && info.Revision > st.Head()):
		return fmt.Sprintf("holds revision %d (epoch %d), and the log's head is revision %d (epoch %d)", info.Revision, info.Epoch, st.Head(), st.Epoch())
	}
	return ""
}

// after waits until every limiter that answers reports revision rev of
// epoch (or a later one), and returns a refusal when one refused the
// record (its content's hash sha256), or does not apply it within
// fleetConfirmWait, or when none answers. A limiter that fails
// downAfter questions in a row is taken for down and not waited for: it
// applies the log's rule when it is back, as the others did.
func (g *writeGate) after(rev, epoch int64, sha256 string, signed bool) (code, reason string) {
	if len(g.urls) == 0 {
		return "", ""
	}
	const downAfter = 3
	ctx, cancel := context.WithTimeout(context.Background(), fleetConfirmWait)
	defer cancel()
	pending := map[string]int{} // limiter → questions failed in a row
	for _, u := range g.urls {
		pending[u] = 0
	}
	answered := 0
	last := map[string]policylog.Info{}
	for {
		for _, u := range g.urls {
			fails, ok := pending[u]
			if !ok || fails >= downAfter {
				continue
			}
			info, err := g.limiterPolicy(ctx, u)
			if err != nil {
				pending[u] = fails + 1
				continue
			}
			pending[u], last[u] = 0, info
			if r := info.Refused; r != nil && r.SHA256 == sha256 && r.Revision == rev {
				return r.Code, fmt.Sprintf("revision %d is in the log, and limiter %s refused it: %s", rev, u, r.Reason)
			}
			if info.Signed && !signed {
				return policylog.CodeUnauthenticated, fmt.Sprintf("revision %d is in the log, and limiter %s refuses it: it trusts only signed records", rev, u)
			}
			if info.Status == policylog.StatusStale {
				return codeLostLog, fmt.Sprintf("revision %d is in the log, and limiter %s refuses the log as it is (%s)", rev, u, info.LogError)
			}
			if info.Source == policylog.SourceKafka && (info.Epoch > epoch || (info.Epoch == epoch && info.Revision >= rev)) {
				delete(pending, u)
				answered++
			}
		}
		waiting := ""
		for _, u := range g.urls {
			if fails, ok := pending[u]; ok && fails < downAfter {
				waiting = u
				break
			}
		}
		if waiting == "" {
			break
		}
		select {
		case <-ctx.Done():
			info := last[waiting]
			return "not_applied", fmt.Sprintf("revision %d is in the log, and limiter %s has not applied it after %s: it holds revision %d (epoch %d, source %s, status %q%s)",
				rev, waiting, fleetConfirmWait, info.Revision, info.Epoch, info.Source, info.Status, logErrorOf(info))
		case <-time.After(20 * time.Millisecond):
		}
	}
	if answered == 0 {
		return "not_applied", fmt.Sprintf("revision %d is in the log, and no limiter of LIMITER_FLEET_URLS answered to confirm it", rev)
	}
	return "", ""
}

func logErrorOf(info policylog.Info) string {
	if info.LogError == "" {
		return ""
	}
	return ": " + info.LogError
}

// writeGateOf is the gate of a write, from the environment.
func writeGateOf(keys policylog.Keys) *writeGate { return newWriteGate(keys, os.Getenv) }
