package policyctl

// `limiter fleet status`: what every limiter of LIMITER_FLEET_URLS
// says of its policy.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/ratewarden/ratewarden/internal/cli"
	"github.com/ratewarden/ratewarden/policylog"
)

const fleetUsage = `usage:
  limiter fleet status [--limiters URL,URL...] [--json]   (default: LIMITER_FLEET_URLS)`

// fleetCommand runs `limiter fleet status`: what each limiter says it
// applied (its /readyz), beside the head of the log.
func fleetCommand(verb string, args []string, stdout, stderr io.Writer) int {
	f := newCLIFlags("limiter fleet "+verb, fleetUsage, stdout, stderr)
	urls := f.String("limiters", os.Getenv("LIMITER_FLEET_URLS"), "comma-separated base URLs of the limiters")
	asJSON := f.Bool("json", false, "print JSON")
	if code, ok := f.parse(args); !ok {
		return code
	}
	if len(f.args) != 0 {
		return cli.Refuse("fleet status takes no arguments", f.FlagSet, fleetUsage, stderr)
	}
	var targets []string
	for _, u := range strings.Split(*urls, ",") {
		if u = strings.TrimSpace(u); u != "" {
			targets = append(targets, strings.TrimSuffix(u, "/"))
		}
	}
	if len(targets) == 0 {
		fmt.Fprintln(stderr, "no limiters: give --limiters or LIMITER_FLEET_URLS\n"+fleetUsage)
		return 2
	}
	return withLog(stderr, false, func(ctx context.Context, c *policylog.Client) int {
		head := c.State().Head()
		type row struct {
			URL      string `json:"url"`
			Revision int64  `json:"revision"`
			Source   string `json:"source,omitempty"`
			Hash     string `json:"hash,omitempty"`
			Error    string `json:"error,omitempty"`
			Current  bool   `json:"current"`
		}
		rows := make([]row, 0, len(targets))
		behind := 0
		hc := &http.Client{Timeout: 5 * time.Second}
		for _, u := range targets {
			r := row{URL: u}
			var body struct{ Policy policylog.Info }
			resp, err := hc.Get(u + "/readyz")
			if err == nil {
				err = json.NewDecoder(resp.Body).Decode(&body)
				resp.Body.Close()
			}
			if err != nil {
				r.Error = err.Error()
			} else {
				r.Revision, r.Source, r.Hash = body.Policy.Revision, body.Policy.Source, body.Policy.Hash
				r.Current = r.Source == policylog.SourceKafka && r.Revision == head
			}
			if !r.Current {
				behind++
			}
			rows = append(rows, r)
		}
		if *asJSON {
			_ = json.NewEncoder(stdout).Encode(map[string]any{"head": head, "limiters": rows})
		} else {
			fmt.Fprintf(stdout, "log head: revision %d\n", head)
			for _, r := range rows {
				if r.Error != "" {
					fmt.Fprintf(stdout, "%s\tunreachable: %s\n", r.URL, r.Error)
					continue
				}
				mark := "current"
				if !r.Current {
					mark = "BEHIND"
				}
				fmt.Fprintf(stdout, "%s\trevision %d\tsource %s\t%s\n", r.URL, r.Revision, r.Source, mark)
			}
		}
		if behind > 0 {
			return 1
		}
		return 0
	})
}
