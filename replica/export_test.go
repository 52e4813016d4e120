package replica

import (
	"context"
	"time"
)

// What the tests check that is not part of the API.

const (
	DefaultInterval = defaultInterval
	Lapse           = lapse
)

var ErrStarted = errStarted

type Row = row

func (r *Registry) Name() string                            { return r.name }
func (r *Registry) Interval() time.Duration                 { return r.interval }
func (r *Registry) Heartbeat(ctx context.Context) error     { return r.heartbeat(ctx) }
func (r *Registry) LastError() error                        { return r.lastError() }
func (r *Registry) List(ctx context.Context) ([]row, error) { return r.list(ctx) }
