package main

import (
	"context"
	"github.com/ratewarden/ratewarden/testkit/testenv"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestConfigErrorsExitTwoTogether: the usage API's configuration errors,
// the OTEL_* ones included (they used to exit 1 once ClickHouse was
// opened), stop it before anything starts: exit 2, one line naming each.
func TestConfigErrorsExitTwoTogether(t *testing.T) {
	testenv.SkipShort(t)
	t.Parallel()
	good := []string{"USAGE_ADMIN_TOKEN=admin-token-0123456789", "USAGE_TOKEN_SECRET=secret-0123456789abcdef", "USAGE_API_ADDR=127.0.0.1:1"}
	for _, tc := range []struct {
		env  []string
		want []string
	}{
		{[]string{"OTEL_TRACES_SAMPLER=sometimes"}, []string{"OTEL_TRACES_SAMPLER"}},
		{[]string{"OTEL_EXPORTER_OTLP_PROTOCOL=pigeon", "USAGE_QUERY_TIMEOUT=forever"}, []string{"OTEL_EXPORTER_OTLP_PROTOCOL", "USAGE_QUERY_TIMEOUT"}},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cmd := exec.CommandContext(ctx, filepath.Join(bins, "usage-api"))
		cmd.Env = append(append(os.Environ(), good...), tc.env...)
		out, err := cmd.CombinedOutput()
		cancel()
		ee, ok := err.(*exec.ExitError)
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if !ok || ee.ExitCode() != 2 || len(lines) != 1 {
			t.Errorf("%v: exit %v, output %q: want 2 and one line", tc.env, err, out)
			continue
		}
		for _, name := range tc.want {
			if !strings.Contains(lines[0], name+":") {
				t.Errorf("%v: the line does not name %s: %s", tc.env, name, lines[0])
			}
		}
	}
}
