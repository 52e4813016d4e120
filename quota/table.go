package quota

import (
	"context"

	"github.com/pglimit/pglimit/db"
)

// The statements of a Limiter on its table: quota_usage (UNLOGGED), or
// quota_ledger (LOGGED) with Options.Durable. The two tables have the same
// columns and their queries the same text, so each ledger query takes and
// returns the usage query's types, converted: the rest of the package
// speaks of one table.

func (l *Limiter) chargeRow(ctx context.Context, dbtx db.DBTX, p *db.QuotaUsageChargeParams) (*db.QuotaUsageChargeRow, error) {
	if !l.durable {
		return l.q.QuotaUsageCharge(ctx, dbtx, p)
	}
	r, err := l.q.QuotaLedgerCharge(ctx, dbtx, (*db.QuotaLedgerChargeParams)(p))
	return (*db.QuotaUsageChargeRow)(r), err
}

func (l *Limiter) settleRow(ctx context.Context, dbtx db.DBTX, p *db.QuotaUsageSettleParams) (*db.QuotaUsageSettleRow, error) {
	if !l.durable {
		return l.q.QuotaUsageSettle(ctx, dbtx, p)
	}
	r, err := l.q.QuotaLedgerSettle(ctx, dbtx, (*db.QuotaLedgerSettleParams)(p))
	return (*db.QuotaUsageSettleRow)(r), err
}

func (l *Limiter) peekRow(ctx context.Context, p *db.QuotaUsagePeekParams) (*db.QuotaUsagePeekRow, error) {
	if !l.durable {
		return l.q.QuotaUsagePeek(ctx, l.pool, p)
	}
	r, err := l.q.QuotaLedgerPeek(ctx, l.pool, (*db.QuotaLedgerPeekParams)(p))
	return (*db.QuotaUsagePeekRow)(r), err
}

func (l *Limiter) keyRows(ctx context.Context, p *db.QuotaUsageKeysParams) ([]*db.QuotaUsageKeysRow, error) {
	if !l.durable {
		return l.q.QuotaUsageKeys(ctx, l.pool, p)
	}
	ledger, err := l.q.QuotaLedgerKeys(ctx, l.pool, (*db.QuotaLedgerKeysParams)(p))
	rows := make([]*db.QuotaUsageKeysRow, len(ledger))
	for i, r := range ledger {
		rows[i] = (*db.QuotaUsageKeysRow)(r)
	}
	return rows, err
}

func (l *Limiter) resetRow(ctx context.Context, p *db.QuotaUsageResetParams) (int64, error) {
	if !l.durable {
		return l.q.QuotaUsageReset(ctx, l.pool, p)
	}
	return l.q.QuotaLedgerReset(ctx, l.pool, (*db.QuotaLedgerResetParams)(p))
}
