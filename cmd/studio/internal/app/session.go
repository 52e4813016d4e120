package app

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
	"unicode/utf8"

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

// maxSessionBody bounds a sign-in body, in the throttle (MaxBodyBytes:
// 413 sign-in-request-too-large) and in handleSession alike.
const maxSessionBody = 4096

// parseSession reads a sign-in body as strictly as every JSON body of the
// service (decodeJSON): valid UTF-8, one JSON object and nothing after it,
// no member but username and password, both strings and both present.
// ok is false for anything else.
func parseSession(body []byte) (req sessionRequest, ok bool) {
	if !utf8.Valid(body) {
		return req, false
	}
	var v struct {
		Username *string `json:"username"`
		Password *string `json:"password"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil || v.Username == nil || v.Password == nil {
		return req, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return req, false // trailing data
	}
	return sessionRequest{Username: *v.Username, Password: *v.Password}, true
}

// signInUsername is the username of a sign-in body, normalised as
// signin's default is, whatever the Content-Type says (the service reads
// every JSON body that way, and curl -d sends a form type), for every
// sign-in throttle's key and device cookie. The body must be a sign-in
// request handleSession accepts (parseSession): a malformed one has no
// username, so the throttles answer it 400 invalid-sign-in-request before
// they write anything, and handleSession never runs. A parse laxer than
// the handler's would let anyone fill the throttle table with rows of
// requests the handler refuses without checking a password.
func signInUsername(r *http.Request) (string, bool) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return "", false
	}
	req, ok := parseSession(body)
	if !ok {
		return "", false
	}
	username := signin.NormalizeUsername(req.Username)
	return username, username != ""
}

// setupDevices reads the keys of the sign-in throttle's device cookies
// (device_cookie_key, made by the service's migration; the newest signs).
// Every replica reads the same keys, so each accepts a cookie another set.
func (a *App) setupDevices(ctx context.Context) error {
	keys, err := a.q.DeviceCookieKeys(ctx, a.primary)
	if err != nil {
		return fmt.Errorf("device cookie keys: %w", err)
	}
	a.devices, err = signin.NewDevices(signin.DeviceOptions{Keys: keys})
	return err
}

// signInLimited wraps the sign-in handler in its throttles: the client
// address's (when on) around the pair's (username and client) around
// the username's over every client (when on), so the widest is asked
// first and a sign-in an inner one refuses gives the outer attempts back.
func (a *App) signInLimited(next http.Handler) http.Handler {
	h := next
	if a.signinUser != nil {
		h = a.signinUser.Handler(h)
	}
	h = a.signin.Handler(h)
	if a.signinAddr != nil {
		h = a.signinAddr.Handler(h)
	}
	return h
}

// handleSession signs in (POST /api/session) behind the sign-in throttle:
// 200 {"token"} or 401 invalid-credentials, the same for an unknown
// username and a wrong password (a request without a username never gets
// here: the throttle answers it 400 invalid-sign-in-request).
func (a *App) handleSession(w http.ResponseWriter, r *http.Request) {
	var req sessionRequest
	if !decodeJSON(w, r, &req, maxSessionBody) {
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
