package policylog_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ratewarden/ratewarden/policylog"
)

// TestRoles: a support key signs documents a reset accepts but no policy
// record; a read key's documents verify with role read (the reset refuses
// it); a writer is the default; an unknown role is refused at parse.
func TestRoles(t *testing.T) {
	writer, _ := policylog.GenerateSigner()
	sup, _ := policylog.GenerateSigner()
	rd, _ := policylog.GenerateSigner()
	ring, err := policylog.ParseKeyring(strings.NewReader(writer.KeyringLine("alice") + "\n" +
		sup.KeyringLine("sam") + " role=support\n" + rd.KeyringLine("rita") + " until=5 role=read\n"))
	if err != nil {
		t.Fatal(err)
	}
	rec := &policylog.Record{Kind: policylog.KindPolicy, Revision: 1, Message: "m", Document: "version: 1\n"}
	for _, c := range []struct {
		s      *policylog.Signer
		who    string
		record bool
		role   string
	}{{writer, "alice", true, policylog.RoleWriter}, {sup, "sam", false, policylog.RoleSupport}, {rd, "rita", false, policylog.RoleRead}} {
		v, err := c.s.Encode(rec)
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = ring.Authenticate(rec.LogKey(), v)
		if c.record != (err == nil) {
			t.Errorf("%s signs a policy record: err %v, want accepted %t", c.who, err, c.record)
		}
		if err != nil && !errors.Is(err, policylog.ErrUnauthenticated) {
			t.Errorf("%s: %v does not wrap ErrUnauthenticated", c.who, err)
		}
		doc := []byte(`{"key":"k"}`)
		id, role, err := ring.VerifyDocument(doc, c.s.SignDocument(doc))
		if err != nil || id != c.who || role != c.role {
			t.Errorf("%s's document: %q %q %v; want %s, %s", c.who, id, role, err, c.who, c.role)
		}
		if _, _, err := ring.VerifyDocument([]byte(`{"key":"other"}`), c.s.SignDocument(doc)); !errors.Is(err, policylog.ErrUnauthenticated) {
			t.Errorf("%s's signature on another document: %v, want refused", c.who, err)
		}
	}
	if _, err := policylog.ParseKeyring(strings.NewReader(sup.KeyringLine("sam") + " role=root\n")); err == nil {
		t.Error("role=root parsed, want refused")
	}
}
