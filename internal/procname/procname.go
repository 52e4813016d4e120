// Package procname names this process for the rows it writes: host:pid.
package procname

import (
	"fmt"
	"os"
)

// Default is host:pid, the default name of a replica on the rows it writes.
func Default() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s:%d", host, os.Getpid())
}
