package app

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/crypto/bcrypt"

	"github.com/pglimit/pglimit/cmd/studio/internal/studiodb"
	"github.com/pglimit/pglimit/middleware/signin"
	"github.com/pglimit/pglimit/problem"
)

// sessionTTL is how long a token issued by a sign-in lives.
const sessionTTL = 12 * time.Hour

// dummyHash is compared against when the username is unknown, so an
// unknown user costs the same bcrypt work as a wrong password.
var dummyHash, _ = bcrypt.GenerateFromPassword([]byte("not a password of anyone"), bcrypt.DefaultCost)

type sessionRequest struct {
	Username string `json:"username"`
	Password string `json:"password"`
}

// signInKey keys the sign-in throttle on the username of the JSON body,
// normalised as signin's default key is, whatever the Content-Type says:
// the service reads every JSON body that way (decodeJSON), and curl -d
// sends a form type. A body that is not a JSON object with a username is
// not identified: the throttle answers it 400 invalid-sign-in-request and
// handleSession never runs.
func signInKey(r *http.Request) (string, bool) {
	var req struct {
		Username *string `json:"username"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Username == nil {
		return "", false
	}
	username := signin.NormalizeUsername(*req.Username)
	if username == "" {
		return "", false
	}
	return "username:" + username, true
}

// handleSession signs in (POST /api/session) behind the sign-in throttle:
// 200 {"token"} or 401 invalid-credentials, the same for an unknown
// username and a wrong password (a request without a username never gets
// here: the throttle answers it 400 invalid-sign-in-request).
func (a *App) handleSession(w http.ResponseWriter, r *http.Request) {
	var req sessionRequest
	if !decodeJSON(w, r, &req, 4096) {
		return
	}
	username := signin.NormalizeUsername(req.Username)
	ctx, cancel := dbContext(r.Context())
	user, err := a.q.AppUserByName(ctx, a.primary, username)
	cancel()
	hash := dummyHash
	switch {
	case err == nil:
		hash = []byte(user.PasswordHash)
	case errors.Is(err, pgx.ErrNoRows):
	default:
		abandon(r.Context())
		a.signInUnavailable(w, r, err)
		return
	}
	if bcrypt.CompareHashAndPassword(hash, []byte(req.Password)) != nil || user == nil {
		problem.Write(w, &problem.Details{Slug: "invalid-credentials", Title: "Invalid credentials", Status: http.StatusUnauthorized,
			Detail: "The username or the password is wrong."})
		return
	}
	raw := make([]byte, 32)
	_, _ = rand.Read(raw)
	token := base64.RawURLEncoding.EncodeToString(raw)
	ctx, cancel = dbContext(r.Context())
	defer cancel()
	if _, err := a.q.ApiTokenCreate(ctx, a.primary, &studiodb.ApiTokenCreateParams{
		Digest: TokenDigest(token), UserID: user.ID, Name: "session", TtlMs: sessionTTL.Milliseconds(),
	}); err != nil {
		abandon(r.Context())
		a.signInUnavailable(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"token": token, "expiresIn": int(sessionTTL.Seconds())})
}

// abandon reports that the sign-in request was not an attempt (no
// password was judged): the throttle gives its reservation back.
func abandon(ctx context.Context) {
	if p, ok := signin.FromContext(ctx); ok {
		_ = p.Release(ctx)
	}
}
