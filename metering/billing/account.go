package billing

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Accounts maps an account (a customer billed once) to its keys. The
// limiter knows keys only; a customer with several keys (one per
// environment, per service) is one account on the invoice. The zero value
// (nil) has no account. Read-only once built: safe for concurrent use.
type Accounts map[string][]string

// MaxAccountKeys bounds the keys of one account: an account statement
// reads each key's statement.
const MaxAccountKeys = 1000

// ParseAccounts reads lines "KEY ACCOUNT" (blank lines and lines starting
// with '#' skipped): the same shape as the Stripe export's customers file,
// so that one file can serve both. A key belongs to one account at most;
// every problem is reported at once.
func ParseAccounts(r io.Reader) (Accounts, error) {
	out := Accounts{}
	owner := map[string]string{}
	var errs []string
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		switch {
		case len(f) != 2:
			errs = append(errs, fmt.Sprintf("line %d: want KEY ACCOUNT", n))
		case len(f[0]) > 256 || len(f[1]) > 256:
			errs = append(errs, fmt.Sprintf("line %d: a key and an account are at most 256 bytes", n))
		case owner[f[0]] != "" && owner[f[0]] != f[1]:
			errs = append(errs, fmt.Sprintf("line %d: key %s is already in account %s", n, f[0], owner[f[0]]))
		case owner[f[0]] == "":
			owner[f[0]] = f[1]
			out[f[1]] = append(out[f[1]], f[0])
			if len(out[f[1]]) > MaxAccountKeys {
				errs = append(errs, fmt.Sprintf("line %d: account %s has more than %d keys", n, f[1], MaxAccountKeys))
			}
		}
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, err.Error())
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: accounts: %s", ErrInvalid, strings.Join(errs, "; "))
	}
	for a := range out {
		slices.Sort(out[a])
	}
	return out, nil
}

// AccountStatement is an account's usage for a period: the statement of
// each of its keys, and their sum. State is the period's (the same for
// every key); Totals the sum of the keys' totals, net of their
// corrections and adjustments. With verify, Verified is true only if every
// key's statement is.
type AccountStatement struct {
	Account     string      `json:"account"`
	Period      string      `json:"period"`
	TZ          string      `json:"tz"`
	From        string      `json:"from"`
	To          string      `json:"to"`
	State       string      `json:"state"`
	Keys        []Statement `json:"keys"`
	Totals      Totals      `json:"totals"`
	Verified    *bool       `json:"verified,omitempty"`
	Raw         *Totals     `json:"raw,omitempty"`
	Rollups     *Totals     `json:"rollups,omitempty"`
	FinalizedAt string      `json:"finalizedAt,omitempty"` // the latest of its keys'
}

// Account is the statement of account (its keys from accounts) for p. Each
// key's statement is Get's: frozen by the first statement asked of a
// final period, so an account's final statement is the same every time
// it is asked while its keys stay the same. An account accounts does not
// name is ErrNotFound.
func (s *Statements) Account(ctx context.Context, accounts Accounts, account string, p Period, verify bool) (AccountStatement, error) {
	keys, ok := accounts[account]
	if !ok {
		return AccountStatement{}, fmt.Errorf("%w: no account %q in the accounts file (BILLING_ACCOUNTS_FILE)", ErrNotFound, account)
	}
	start, end := p.Bounds()
	out := AccountStatement{Account: account, Period: p.String(), TZ: p.TZ(), From: start.Format(time.RFC3339), To: end.Format(time.RFC3339),
		State: p.State(s.now(), s.grace()), Keys: make([]Statement, 0, len(keys))}
	if verify {
		ok, raw, roll := true, Totals{}, Totals{}
		out.Verified, out.Raw, out.Rollups = &ok, &raw, &roll
	}
	for _, k := range keys {
		st, err := s.Get(ctx, k, p, verify)
		if err != nil {
			return AccountStatement{}, fmt.Errorf("account %s, key %s: %w", account, k, err)
		}
		out.State = st.State // the same for every key; Get's clock is the one that froze it
		out.Totals.add(st.Totals.Requests, st.Totals.Cost)
		if st.FinalizedAt > out.FinalizedAt {
			out.FinalizedAt = st.FinalizedAt
		}
		if verify {
			*out.Verified = *out.Verified && *st.Verified
			out.Raw.add(st.Raw.Requests, st.Raw.Cost)
			out.Rollups.add(st.Rollups.Requests, st.Rollups.Cost)
		}
		out.Keys = append(out.Keys, st)
	}
	return out, nil
}
