package permit

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// batch is a db.DBTX that pipelines sqlc-generated statements: Exec queues
// a statement and answers at once; the following Query queues its own,
// sends them all as one pgx Batch (one round trip, one implicit
// transaction) and returns the last statement's rows; send sends a batch
// of Execs alone. It lets the generated SlotLockScopes, SlotRelease and
// SlotClaim run together without copying their SQL into Go. Use a batch
// for one Exec...Exec, Query sequence (then check closeErr: the error, if
// any, of the batch's end, its commit) or one Exec...Exec, send.
type batch struct {
	conn     dbtx
	b        pgx.Batch
	closeErr error
}

func (x *batch) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	x.b.Queue(sql, args...)
	return pgconn.CommandTag{}, nil
}

// send sends the queued statements and returns the first error, the
// batch's end (its commit) included.
func (x *batch) send(ctx context.Context) error {
	br := x.conn.SendBatch(ctx, &x.b)
	var first error
	for i := 0; i < x.b.Len(); i++ {
		if _, err := br.Exec(); err != nil {
			first = err
			break
		}
	}
	if err := br.Close(); err != nil && first == nil {
		first = err
	}
	return first
}

func (x *batch) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	x.b.Queue(sql, args...)
	br := x.conn.SendBatch(ctx, &x.b)
	for i := 0; i < x.b.Len()-1; i++ {
		if _, err := br.Exec(); err != nil {
			x.closeErr = br.Close()
			return nil, err
		}
	}
	rows, err := br.Query()
	if err != nil {
		x.closeErr = br.Close()
		return nil, err
	}
	return &batchRows{Rows: rows, x: x, br: br}, nil
}

func (x *batch) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := x.Query(ctx, sql, args...)
	if err != nil {
		return errRow{err}
	}
	return rowOf{rows}
}

// batchRows closes the batch after its rows, keeping the batch's error.
type batchRows struct {
	pgx.Rows
	x      *batch
	br     pgx.BatchResults
	closed bool
}

func (r *batchRows) Close() {
	if r.closed {
		return
	}
	r.closed = true
	r.Rows.Close()
	if err := r.br.Close(); err != nil && r.x.closeErr == nil {
		r.x.closeErr = err
	}
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

type errRow struct{ err error }

func (e errRow) Scan(...any) error { return e.err }

type rowOf struct{ rows pgx.Rows }

func (r rowOf) Scan(dest ...any) error {
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}
