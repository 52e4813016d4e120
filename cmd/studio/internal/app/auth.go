package app

import (
	"context"
	"crypto/sha256"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/pglimit/problem"
)

// Identity is the user and token a request authenticated with.
type Identity struct {
	UserID    int64
	Username  string
	TokenID   int64
	TokenName string
	Operator  bool // may see the limits (GET /limits, GET /api/limits)
}

type identityKey struct{}

// IdentityFrom returns the request's identity, set by requireToken.
func IdentityFrom(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(identityKey{}).(Identity)
	return id, ok
}

// userOf is the heavy limiter's identity: the user behind the token.
func userOf(r *http.Request) (string, bool) {
	id, ok := IdentityFrom(r.Context())
	return id.Username, ok
}

// rateKeyOf is the API rate's identity: the user behind the token, so every
// token of a user (each sign-in mints one) shares one rate.
func rateKeyOf(r *http.Request) (string, bool) {
	id, ok := IdentityFrom(r.Context())
	if !ok {
		return "", false
	}
	return "user:" + id.Username, true
}

// tokenOf is the in-flight cap's identity: the token's id, never the token.
func tokenOf(r *http.Request) (string, bool) {
	id, ok := IdentityFrom(r.Context())
	if !ok {
		return "", false
	}
	return strconv.FormatInt(id.TokenID, 10), true
}

// TokenDigest is how a bearer token is stored and looked up: SHA-256.
func TokenDigest(token string) []byte {
	d := sha256.Sum256([]byte(token))
	return d[:]
}

func unauthorized(w http.ResponseWriter, detail string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="studio"`)
	problem.Write(w, &problem.Details{Slug: "unauthorized", Title: "Unauthorized", Status: http.StatusUnauthorized, Detail: detail})
}

// requireToken authenticates "Authorization: Bearer <token>": a missing,
// malformed or unknown token is 401 unauthorized.
func (a *App) requireToken(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := r.Header.Get("Authorization")
		scheme, token, ok := strings.Cut(h, " ")
		token = strings.TrimSpace(token)
		if h == "" {
			a.anonymous(w, r, "This endpoint needs an API token: Authorization: Bearer <token>.")
			return
		}
		if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" || len(token) > 256 || strings.ContainsAny(token, " \t") {
			a.anonymous(w, r, "The Authorization header is malformed; send Authorization: Bearer <token>.")
			return
		}
		ctx, cancel := dbContext(r.Context())
		digest := TokenDigest(token)
		row, err := a.q.ApiTokenLookup(ctx, a.primary, digest)
		cancel()
		if err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				a.anonymous(w, r, "The API token is unknown or expired.")
				return
			}
			a.dbError(w, r, err)
			return
		}
		a.tokens.remember(digest)
		id := Identity{UserID: row.UserID, Username: row.Username, TokenID: row.TokenID, TokenName: row.TokenName, Operator: row.Operator}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), identityKey{}, id)))
	})
}

// requireOperator lets operators through to next and answers anyone else
// 403 forbidden. It runs after requireToken.
func requireOperator(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id, ok := IdentityFrom(r.Context()); !ok || !id.Operator {
			forbidden(w)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func forbidden(w http.ResponseWriter) {
	problem.Write(w, &problem.Details{Slug: "forbidden", Title: "Forbidden", Status: http.StatusForbidden,
		Detail: "This view is for operators only."})
}
