package enforcement_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/enforcement"
)

// classPolicy is fixedPolicy with priority classes (enforcement.Classes):
// critical the whole bucket, sheddable half of it.
type classPolicy struct{ fixedPolicy }

func (classPolicy) PriorityShare(name string) (float64, bool) {
	switch name {
	case "critical":
		return 1, true
	case "", "sheddable":
		return 0.5, true
	}
	return 0, false
}

func (classPolicy) Sheds() bool { return true }

// classReq is a request of cost 1 on key k of class priority.
func classReq(priority string) enforcement.Request {
	r := req("k", 1)
	r.Priority = priority
	return r
}

// TestClassFloorInProcess: on the in-process authority (single-node
// mode), and on the tightened bucket while the authority cannot be asked,
// a class of share 0.5 spends a bucket of 10 down to 5 and is then shed
// with an exact retry time (one token at 1/s: 1 s on this clock), the
// default class being that class here; critical spends on to 0 and is
// refused for the rate; an unknown class is an invalid request.
func TestClassFloorInProcess(t *testing.T) {
	clk := newClock()
	auth := &countingAuthority{next: enforcement.NewMemoryAuthority(clk.Now, 1<<10)}
	pol := classPolicy{fixedPolicy{enforcement.Resolved{Limit: enforcement.Limit{Rate: 1, Burst: 10}, Policy: "p", Tier: "t", Cost: 1}}}
	l := newLimiter(t, enforcement.Config{Authority: auth, Policy: pol, Now: clk.Now})
	ctx := context.Background()
	for _, down := range []bool{false, true} {
		auth.down.Store(down)
		want := enforcement.SourceShared
		if down {
			want = enforcement.SourceDegraded
		}
		for i := range 5 {
			d, err := l.Check(ctx, classReq(""))
			if err != nil || !d.Allowed || d.Source != want {
				t.Fatalf("down %v: default-class request %d: %+v, %v", down, i+1, d, err)
			}
		}
		d, err := l.Check(ctx, classReq("sheddable"))
		if err != nil || d.Allowed || d.Reason != enforcement.ReasonShed || d.Remaining != 5 || d.RetryAfter != time.Second {
			t.Fatalf("down %v: sheddable at its floor: %+v, %v; want shed, 5 left, retry 1s", down, d, err)
		}
		for i := range 5 {
			d, err := l.Check(ctx, classReq("critical"))
			if err != nil || !d.Allowed || d.Remaining != int64(4-i) {
				t.Fatalf("down %v: critical request %d below the floor: %+v, %v", down, i+1, d, err)
			}
		}
		d, err = l.Check(ctx, classReq("critical"))
		if err != nil || d.Allowed || d.Reason != "" || d.RetryAfter != time.Second {
			t.Fatalf("down %v: critical on an empty bucket: %+v, %v; want refused for the rate, retry 1s", down, d, err)
		}
		clk.Add(time.Hour) // full again, for the next round
	}
	if _, err := l.Check(ctx, classReq("bulk")); !errors.Is(err, enforcement.ErrInvalidRequest) {
		t.Fatalf("an unknown class: %v, want ErrInvalidRequest", err)
	}
}
