package tracing

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// The rule the decision path applies before calling the tracer gives the
// SDK's own sampler's verdict on a new trace, for every sampler the
// variables can name: random ids, and ids at the ratio's boundary.
func TestRootRuleAgreesWithTheSDK(t *testing.T) {
	type sampler struct{ name, arg string }
	cases := []sampler{
		{"", ""}, {"always_on", ""}, {"always_off", ""}, {"parentbased_always_on", ""}, {"parentbased_always_off", ""},
		{"traceidratio", ""}, {"parentbased_traceidratio", ""},
	}
	for _, arg := range []string{"0", "1", "0.01", "0.5", "1e-9", "0.999999999", "0.3333333333333333"} {
		cases = append(cases, sampler{"traceidratio", arg}, sampler{"parentbased_traceidratio", arg})
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	for _, c := range cases {
		s, rule, err := samplerFrom(func(k string) string {
			return map[string]string{envSampler: c.name, envSamplerArg: c.arg}[k]
		})
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		var ids []trace.TraceID
		for range 20000 {
			var tid trace.TraceID
			binary.NativeEndian.PutUint64(tid[:8], rnd.Uint64())
			binary.NativeEndian.PutUint64(tid[8:], rnd.Uint64())
			ids = append(ids, tid)
		}
		if rule.kind == rootRatio { // the ids on either side of the bound
			for _, x := range []uint64{rule.bound - 1, rule.bound, rule.bound + 1} {
				for _, low := range []uint64{0, 1} {
					var tid trace.TraceID
					tid[0] = 1
					binary.BigEndian.PutUint64(tid[8:], x<<1|low)
					ids = append(ids, tid)
				}
			}
		}
		kept := 0
		for _, tid := range ids {
			want := s.ShouldSample(sdktrace.SamplingParameters{ParentContext: context.Background(), TraceID: tid, Name: "POST /check",
				Kind: trace.SpanKindServer}).Decision == sdktrace.RecordAndSample
			if got := rule.keeps(tid); got != want {
				t.Fatalf("%s %q (%s): trace %s: rule %v, SDK %v", c.name, c.arg, s.Description(), tid, got, want)
			}
			if want {
				kept++
			}
		}
		t.Logf("%s %q: %d of %d kept", c.name, c.arg, kept, len(ids))
	}
}
