package billing

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestParseAccounts(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		want       Accounts
		errs       []string
	}{
		{"keys of two accounts, sorted", "# key account\nk2 cust_a\n\nk1 cust_a\nk3 cust_b\nk1 cust_a\n",
			Accounts{"cust_a": {"k1", "k2"}, "cust_b": {"k3"}}, nil},
		{"empty", "", Accounts{}, nil},
		{"every problem at once", "k1 a\nk1 b\nonlyone\nk2 a extra\n", nil,
			[]string{"line 2: key k1 is already in account a", "line 3: want KEY ACCOUNT", "line 4: want KEY ACCOUNT"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseAccounts(strings.NewReader(tc.file))
			if tc.errs == nil {
				if err != nil || !reflect.DeepEqual(got, tc.want) {
					t.Fatalf("got %v, %v; want %v", got, err, tc.want)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("err %v, want ErrInvalid", err)
			}
			for _, e := range tc.errs {
				if !strings.Contains(err.Error(), e) {
					t.Errorf("err %q does not say %q", err, e)
				}
			}
		})
	}
}
