package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/crypto/bcrypt"

	"github.com/pglimit/pglimit/middleware/heavy"    // pglimit:heavy
	"github.com/pglimit/pglimit/middleware/inflight" // pglimit:inflight
	"github.com/pglimit/pglimit/middleware/signin"   // pglimit:signin
)

// service holds what the handlers share.
type service struct {
	pool       *pgxpool.Pool
	log        *slog.Logger
	queryDelay time.Duration
}

// routes is the service's HTTP API:
//
//	POST /login {"username","password"}  200 {"token"}; 401 bad credentials; 400 no username
//	GET /orders                          the user's orders (Bearer token)
//	GET /reports/usage                   the user's spending per month (Bearer token): heavy
//	GET /healthz                         200 once migrated
func (s *service) routes() (http.Handler, error) {
	throttle, err := signin.New(s.pool, signin.Options{}) // pglimit:signin
	if err != nil {                                       // pglimit:signin
		return nil, err // pglimit:signin
	} // pglimit:signin
	reports, err := heavy.New(s.pool, heavy.Options{Name: "usage-report", Key: userKey, Limit: 2, Time: 10 * time.Second}) // pglimit:heavy
	if err != nil {                                                                                                        // pglimit:heavy
		return nil, err // pglimit:heavy
	} // pglimit:heavy
	capper, err := inflight.New(s.pool, inflight.Options{Key: tokenKey, Limit: 4}) // pglimit:inflight
	if err != nil {                                                                // pglimit:inflight
		return nil, err // pglimit:inflight
	} // pglimit:inflight

	mux := http.NewServeMux()
	mux.Handle("POST /login", throttle.Handler(http.HandlerFunc(s.login))) // pglimit:signin
	mux.Handle("GET /orders", s.authenticated(http.HandlerFunc(s.listOrders)))
	mux.Handle("GET /reports/usage", s.authenticated(reports.Handler(http.HandlerFunc(s.usageReport)))) // pglimit:heavy
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	return capper.Handler(mux), nil // pglimit:inflight
}

// userKey is whose usage-report cap a request counts against: the user
// authenticated before the report runs.
func userKey(r *http.Request) (string, bool) { u, ok := userOf(r.Context()); return u.name, ok } // pglimit:heavy

// tokenKey is the API token a request is counted against, by a digest:
// never the token itself. A request without one (POST /login) is not
// counted.
func tokenKey(r *http.Request) (string, bool) { // pglimit:inflight
	t, ok := bearerToken(r)         // pglimit:inflight
	return inflight.TokenKey(t), ok // pglimit:inflight
} // pglimit:inflight

// login checks a username and password and answers a new API token.
func (s *service) login(w http.ResponseWriter, r *http.Request) {
	var req struct{ Username, Password string }
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Username == "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "username and password are required"})
		return
	}
	var userID int64
	var hash []byte
	err := s.pool.QueryRow(r.Context(), `SELECT id, password_hash FROM app_user WHERE username = $1`, req.Username).Scan(&userID, &hash)
	known := err == nil
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		s.fail(w, r, "login", err)
		return
	}
	if !known {
		hash = dummyHash // the same work for an unknown user
	}
	ok := bcrypt.CompareHashAndPassword(hash, []byte(req.Password)) == nil && known
	if _, err := s.pool.Exec(r.Context(), `INSERT INTO login_attempt (username, succeeded) VALUES ($1, $2)`, req.Username, ok); err != nil {
		s.fail(w, r, "login", err)
		return
	}
	if !ok {
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "invalid credentials"})
		return
	}
	raw := make([]byte, 32)
	_, _ = rand.Read(raw)
	token := hex.EncodeToString(raw)
	digest := sha256.Sum256([]byte(token))
	if _, err := s.pool.Exec(r.Context(), `INSERT INTO api_token (token_sha256, user_id) VALUES ($1, $2)`, digest[:], userID); err != nil {
		s.fail(w, r, "login", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"token": token})
}

// dummyHash is compared against for a username nobody has.
var dummyHash, _ = bcrypt.GenerateFromPassword([]byte("nobody has this password"), bcrypt.DefaultCost)

// user is an authenticated user.
type user struct {
	id   int64
	name string
}

type userKeyType struct{}

func userOf(ctx context.Context) (user, bool) {
	u, ok := ctx.Value(userKeyType{}).(user)
	return u, ok
}

// bearerToken is the request's API token, if it has one.
func bearerToken(r *http.Request) (string, bool) {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return token, ok && token != ""
}

// authenticated lets through requests with a valid API token, with their
// user in the context, and answers 401 to the others.
func (s *service) authenticated(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := bearerToken(r)
		if !ok {
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "an API token is required"})
			return
		}
		digest := sha256.Sum256([]byte(token))
		var u user
		err := s.pool.QueryRow(r.Context(), `SELECT u.id, u.username FROM api_token AS t JOIN app_user AS u ON u.id = t.user_id
			WHERE t.token_sha256 = $1`, digest[:]).Scan(&u.id, &u.name)
		if errors.Is(err, pgx.ErrNoRows) {
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "unknown API token"})
			return
		}
		if err != nil {
			s.fail(w, r, "authenticate", err)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKeyType{}, u)))
	})
}

// order is one order.
type order struct {
	ID          int64     `json:"id"`
	Item        string    `json:"item"`
	AmountCents int64     `json:"amountCents"`
	CreatedAt   time.Time `json:"createdAt"`
}

// listOrders answers the user's latest orders.
func (s *service) listOrders(w http.ResponseWriter, r *http.Request) {
	u, _ := userOf(r.Context())
	if err := s.delay(r.Context(), s.pool, "list-orders"); err != nil {
		s.fail(w, r, "orders", err)
		return
	}
	rows, err := s.pool.Query(r.Context(), `SELECT id, item, amount_cents, created_at FROM orders
		WHERE user_id = $1 ORDER BY id DESC LIMIT 50`, u.id)
	if err != nil {
		s.fail(w, r, "orders", err)
		return
	}
	orders, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (order, error) {
		var o order
		err := row.Scan(&o.ID, &o.Item, &o.AmountCents, &o.CreatedAt)
		return o, err
	})
	if err != nil {
		s.fail(w, r, "orders", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"orders": orders})
}

// month is one month of a user's spending.
type month struct {
	Month       string `json:"month"`
	Orders      int64  `json:"orders"`
	AmountCents int64  `json:"amountCents"`
}

// usageReport answers the user's spending per month: the expensive
// endpoint, which reads all of the user's orders.
func (s *service) usageReport(w http.ResponseWriter, r *http.Request) {
	u, _ := userOf(r.Context())
	if err := s.delay(r.Context(), s.pool, "usage-report"); err != nil {
		s.fail(w, r, "usage report", err)
		return
	}
	var months []month                                                                                                                 // pglimit:heavy
	err := heavy.Read(r.Context(), s.pool, func(tx pgx.Tx) (err error) { months, err = readUsage(r.Context(), tx, u.id); return err }) // pglimit:heavy
	if err != nil {
		s.log.ErrorContext(r.Context(), "adopt: usage report", "err", err) // pglimit:heavy
		heavy.WriteError(w, r, err)                                        // pglimit:heavy
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"months": months})
}

// readUsage reads a user's spending per month.
func readUsage(ctx context.Context, q querier, userID int64) ([]month, error) {
	rows, err := q.Query(ctx, `SELECT to_char(date_trunc('month', created_at), 'YYYY-MM'), count(*), sum(amount_cents)::bigint
		FROM orders WHERE user_id = $1 GROUP BY 1 ORDER BY 1`, userID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (month, error) {
		var m month
		err := row.Scan(&m.Month, &m.Orders, &m.AmountCents)
		return m, err
	})
}

// querier runs statements on the pool or in a transaction.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// delay waits -query-delay in the database, in a statement named by a
// comment (what an observer of pg_stat_activity looks for).
func (s *service) delay(ctx context.Context, q querier, name string) error {
	if s.queryDelay <= 0 {
		return nil
	}
	_, err := q.Exec(ctx, `/* `+name+` */ SELECT pg_sleep($1)`, s.queryDelay.Seconds())
	return err
}

// fail logs err and answers 500.
func (s *service) fail(w http.ResponseWriter, r *http.Request, what string, err error) {
	s.log.ErrorContext(r.Context(), "adopt: "+what, "err", err)
	writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "internal error"})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
