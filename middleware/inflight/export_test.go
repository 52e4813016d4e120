package inflight

import (
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// NewWithGrace is New with a grace other than 30 s, so that tests can watch
// a vanished holder's slot lapse without waiting half a minute.
func NewWithGrace(pool *pgxpool.Pool, opts Options, grace time.Duration) (*Limiter, error) {
	return newLimiter(pool, opts, grace)
}

// Scope is the scope key of key's slots.
var Scope = scopeOf

// Limit is the number of requests a token may have in flight.
func (l *Limiter) Limit() int { return l.limit }

// Name is the limit's name.
func (l *Limiter) Name() string { return l.core.Name }

// SetShareLease sets how long l's share lease runs and how long a new
// holder waits before it runs requests on its share.
func SetShareLease(l *Limiter, lease, wait time.Duration) { l.core.ShareLease().SetLease(lease, wait) }

// Spending reports whether l holds a share it may run requests on now.
func Spending(l *Limiter) bool {
	_, ok := l.core.ShareLease().Spendable(time.Now())
	return ok
}

// Kill stops l's share as a killed replica's stops: never given back.
func Kill(l *Limiter) { l.core.ShareLease().Kill() }
