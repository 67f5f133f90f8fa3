package envconfig

import (
	"strconv"
	"strings"
)

// Bool is true/false (also 1/0, t/f, as strconv.ParseBool), or def.
func (r *Reader) Bool(name string, def bool) bool {
	v := strings.TrimSpace(r.get(name))
	if v == "" {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		r.Fail(name, "%q is not true or false", v)
		return def
	}
	return b
}
