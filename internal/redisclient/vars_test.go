package redisclient

import (
	"slices"
	"testing"

	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/limits"
)

// TestVarsAreWhatFromEnvPrefixReads: Vars lists exactly the variables
// FromEnvPrefix asks the environment for, so the deployment checks that
// rely on it see what the code reads.
func TestVarsAreWhatFromEnvPrefixReads(t *testing.T) {
	for _, prefix := range []string{"REDIS", "GLOBAL_REDIS"} {
		var asked []string
		e := envconfig.New(func(name string) string {
			if !slices.Contains(asked, name) {
				asked = append(asked, name)
			}
			return ""
		})
		FromEnvPrefix(e, prefix, limits.DefaultKeyPrefix)
		want := Vars(prefix)
		slices.Sort(asked)
		slices.Sort(want)
		if !slices.Equal(asked, want) {
			t.Errorf("%s: FromEnvPrefix reads %v, Vars says %v", prefix, asked, want)
		}
	}
}
