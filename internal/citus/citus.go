// Package citus tells a limiter whether its database is a Citus cluster's,
// where pglimit.Migrate has distributed the limit tables
// (sql/schema/citus/distribute.sql) and a decision is one of the functions
// that run on the shard of its key (migration 00006) instead of the
// statements pglimit runs on one server.
package citus

import (
	"context"
	"sync/atomic"

	"github.com/pglimit/pglimit/db"
)

// Detector asks the database once, on the first decision, and remembers
// the answer (a database does not become a Citus cluster under a running
// service). Its zero value is ready to use and safe for concurrent use.
type Detector struct {
	state atomic.Int32 // 0 not asked yet, 1 one server, 2 Citus
}

// On reports whether the database behind conn is a Citus cluster's.
func (d *Detector) On(ctx context.Context, conn db.DBTX) (bool, error) {
	switch d.state.Load() {
	case 1:
		return false, nil
	case 2:
		return true, nil
	}
	on, err := db.New().SchemaOnCitus(ctx, conn)
	if err != nil {
		return false, err
	}
	d.Set(on)
	return on, nil
}

// Set fixes the answer: tests make the functions decide on one server, to
// compare their decisions with the statements'.
func (d *Detector) Set(on bool) {
	if on {
		d.state.Store(2)
	} else {
		d.state.Store(1)
	}
}
