package chsink

// OptionalColumns are the names of decisions_raw's optional columns.
func OptionalColumns() []string {
	var names []string
	for _, c := range optionalColumns {
		names = append(names, c.name)
	}
	return names
}
