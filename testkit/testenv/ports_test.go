package testenv

import "testing"

// TestPortsAreOutsideTheEphemeralRange: a port handed out for a server to
// bind later must not be one the kernel may give an outgoing connection
// meanwhile.
func TestPortsAreOutsideTheEphemeralRange(t *testing.T) {
	lo, hi := ephemeralRange()
	inside := func(p int) bool { return p >= lo && p <= hi }
	for range 200 {
		if p := FreePort(t); inside(p) {
			t.Fatalf("FreePort gave %d, inside the ephemeral range %d-%d", p, lo, hi)
		}
	}
	ports, err := ClusterPorts(50)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if inside(p) || inside(p+10000) {
			t.Fatalf("ClusterPorts gave %d (bus %d), inside the ephemeral range %d-%d", p, p+10000, lo, hi)
		}
		if seen[p] || seen[p+10000] || seen[p-10000] {
			t.Fatalf("ClusterPorts gave %d twice or as another's bus port: %v", p, ports)
		}
		seen[p] = true
	}
}
