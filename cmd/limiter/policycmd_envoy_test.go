package main

import (
	"strings"
	"testing"
)

// TestPolicyCommandsShowDomains: check lists the Envoy domains and their
// mappings; explain follows a descriptor through its mapping to the limit.
func TestPolicyCommandsShowDomains(t *testing.T) {
	code, out, errOut := runPolicy("check", "../../deploy/policy.yaml")
	if code != 0 || !strings.Contains(out, "domain edge:\n  per-ip               [remote_address] -> key \"ip:{remote_address}\" scope \"edge\"") {
		t.Fatalf("check: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runPolicy("explain", "../../deploy/policy.yaml", "--domain", "edge", "--descriptor", "remote_address=203.0.113.7")
	for _, want := range []string{
		`domain "edge", descriptor [remote_address=203.0.113.7]`,
		"mapping: domains.edge.descriptors[0] per-ip",
		`key   "ip:203.0.113.7" from "ip:{remote_address}"`,
		"winner: anonymous",
		"result: policy=anonymous rate=1/s burst=5",
	} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("explain --domain: exit %d, missing %q\n%s%s", code, want, out, errOut)
		}
	}
	code, out, _ = runPolicy("explain", "../../deploy/policy.yaml", "--domain", "edge", "--descriptor", "user=u1")
	if code != 0 || !strings.Contains(out, "no mapping matches") {
		t.Errorf("explain, no match: exit %d\n%s", code, out)
	}
	for _, args := range [][]string{
		{"explain", "../../deploy/policy.yaml", "--domain", "edge"},                                      // no descriptor
		{"explain", "../../deploy/policy.yaml", "--descriptor", "a=b"},                                   // no domain
		{"explain", "../../deploy/policy.yaml", "--domain", "edge", "--descriptor", "a=b", "--key", "k"}, // both forms
		{"explain", "../../deploy/policy.yaml", "--domain", "edge", "--descriptor", "novalue"},           // not KEY=VALUE
		{"check", "../../deploy/policy.yaml", "--domain", "edge"},                                        // check takes no flags
	} {
		if code, _, _ := runPolicy(args...); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
}
