package keyslot_test

import (
	"testing"

	"github.com/ratewarden/ratewarden/enforcement/keyslot"
)

func TestSlot(t *testing.T) {
	for _, c := range []struct {
		key  string
		want uint16
	}{
		{"123456789", 0x31C3 % 16384}, // the CRC16/XMODEM check value
		{"foo", 12182},                // CLUSTER KEYSLOT foo
		{"{user1000}.following", keyslot.Slot("user1000")},
		{"foo{}{bar}", keyslot.Slot("foo{}{bar}")}, // empty tag: the whole key
		{"rl:{acct_1}:b2:api", keyslot.Slot("acct_1")},
	} {
		if got := keyslot.Slot(c.key); got != c.want {
			t.Errorf("Slot(%q) = %d, want %d", c.key, got, c.want)
		}
	}
}

func TestKeySlotMatchesBucketKey(t *testing.T) {
	for _, k := range []string{"acct_1", "user:42", "ip:203.0.113.7", "a}b", "}x", "{x}"} {
		if got, want := keyslot.KeySlot(k, "api:search"), keyslot.Slot(keyslot.BucketKey("rl", k, "api:search")); got != want {
			t.Errorf("KeySlot(%q) = %d, want %d", k, got, want)
		}
	}
}
