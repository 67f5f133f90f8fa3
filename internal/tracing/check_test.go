package tracing_test

import (
	"strings"
	"testing"

	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/internal/tracing"
)

// TestCheckNamesEveryBadVariable: Check finds what New would refuse, and
// the exporters' values the SDK would only log and replace; a header's
// value (a credential) is never repeated.
func TestCheckNamesEveryBadVariable(t *testing.T) {
	env := map[string]string{
		"OTEL_SDK_DISABLED":                     "maybe",
		"OTEL_EXPORTER_OTLP_ENDPOINT":           "::nohost",
		"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL":    "pigeon",
		"OTEL_TRACES_SAMPLER":                   "traceidratio",
		"OTEL_TRACES_SAMPLER_ARG":               "1.5",
		"OTEL_EXPORTER_OTLP_TIMEOUT":            "10s",
		"OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "zip",
		"OTEL_EXPORTER_OTLP_HEADERS":            "authorization=Bearer%20s3cret,broken",
	}
	e := envconfig.New(func(k string) string { return env[k] })
	tracing.CheckConfig(e)
	err := e.Err()
	if err == nil {
		t.Fatal("accepted")
	}
	for name := range env {
		if name == "OTEL_TRACES_SAMPLER" {
			continue // good; its argument is not
		}
		if !strings.Contains(err.Error(), name+":") {
			t.Errorf("%s not named: %v", name, err)
		}
	}
	if strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("a header value, or more than one line: %v", err)
	}
	if _, err := tracing.New(func(k string) string { return env[k] }, "x"); err == nil {
		t.Fatal("New accepted what Check refused")
	}
	ok := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
		"OTEL_EXPORTER_OTLP_COMPRESSION": "gzip", "OTEL_EXPORTER_OTLP_HEADERS": "a=b, c=d%20e", "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
		"OTEL_TRACES_SAMPLER_ARG": "0.25"}
	if p := tracing.Check(func(k string) string { return ok[k] }); len(p) != 0 {
		t.Fatalf("good values refused: %v", p)
	}
}
