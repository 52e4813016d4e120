package heavy

// What the tests reach that an adopter does not.

// FormatLimit writes a time bound as marks and problems name it.
var FormatLimit = formatLimit

// InstallationLimit is the cap over all heavy requests of all replicas.
func (l *Limiter) InstallationLimit() int { return l.instCap }

// Name is the limit's name.
func (l *Limiter) Name() string { return l.core.Name }
