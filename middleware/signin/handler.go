package signin

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/netip"
	"net/url"
	"strings"

	"golang.org/x/text/cases"
	"golang.org/x/text/unicode/norm"

	"github.com/pglimit/pglimit/clientaddr"
	"github.com/pglimit/pglimit/internal/vocab"
	"github.com/pglimit/pglimit/middleware/internal/respond"
)

// Handler throttles the sign-in handler next. For each request it buffers
// the body (at most MaxBodyBytes), reads the client key with Options.Key,
// and checks the key: a throttled key is refused (429), a database that
// cannot be reached fails the sign-in (503), and otherwise next runs with
// the Permit in its context (FromContext) and the body intact. The outcome
// is what next reports on the Permit (FromContext, then Fail, Succeed or
// Release), or else what
// its status says: 401 a failure, 2xx a success, anything else (or a panic,
// or nothing written) not an attempt. A failure is recorded before the 401
// goes out; if it cannot be recorded the client gets 503 instead. A request
// without a key is refused 400 invalid-sign-in-request (errNoKey through
// OnError) and next never runs: a password the throttle cannot count is
// never checked. A request Options.Exempt exempts goes to next at once,
// uncounted, with a Permit that counts nothing (Permit.Exempt).
func (l *Limiter) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if l.exempt != nil && l.exempt(r) {
			l.engine.Exempted(r.Context())
			l.serveUncounted(w, r, next, nil)
			return
		}
		body, err := readBody(w, r, l.maxBody)
		if err != nil {
			var tooLarge *http.MaxBytesError
			if !errors.As(err, &tooLarge) {
				err = fmt.Errorf("%w: %w", errUnreadable, err)
			}
			l.onError(w, r, err)
			return
		}
		// The device cookie of the request's username, when Devices are
		// on; the username is read from its own copy of the body.
		var (
			username string
			dev      device
		)
		if l.devices != nil {
			if u, ok := l.username(withBody(r, body)); ok && u != "" {
				username, dev = u, l.devices.check(r, u)
			}
		}
		var issue func(http.Header)
		if l.devices != nil && l.scope == scopeUsername && username != "" {
			// A successful sign-in leaves the client the username's device
			// cookie (the same device again when it presented one).
			issue = func(h http.Header) { l.devices.issue(h, username, dev) }
		}
		if dev.valid && l.scope == scopeUsername {
			// A device the user signed in from before: the username's
			// throttle over every client neither counts nor refuses it.
			l.engine.Exempted(r.Context())
			l.serveUncounted(w, withBody(r, body), next, issue)
			return
		}
		key, err := l.keyOf(withBody(r, body), dev)
		if err != nil {
			l.onError(w, r, err)
			return
		}
		p, err := l.Acquire(r.Context(), key)
		if err != nil {
			if !errors.Is(err, vocab.ErrLimited) {
				respond.Log(r.Context(), l.log, "signin: check failed", err, "limit", l.name)
			}
			l.onError(w, r, err)
			return
		}
		if outer, ok := FromContext(r.Context()); ok {
			// A Limiter's Handler wraps this one (an address's around a
			// username's): what next reports here is reported there too.
			p.outer = outer
		}
		ow := &outcomeWriter{ResponseWriter: w, l: l, p: p, r: r, issue: issue}
		defer func() {
			if v := recover(); v != nil {
				l.settle(r, "panic", p.Release)
				panic(v)
			}
			if !ow.wroteHeader {
				l.settle(r, "no response", p.Release)
			}
		}()
		next.ServeHTTP(ow, withBody(r, body).WithContext(newContext(r.Context(), p)))
	})
}

// serveUncounted runs next for a request this Limiter does not count, with
// a Permit that counts nothing here but reports to the Permit of a
// Limiter wrapped around this one; issue, when set, sets the device
// cookie on a success.
func (l *Limiter) serveUncounted(w http.ResponseWriter, r *http.Request, next http.Handler, issue func(http.Header)) {
	p := &Permit{exempt: true}
	if outer, ok := FromContext(r.Context()); ok {
		p.outer = outer
	}
	if issue != nil {
		w = &outcomeWriter{ResponseWriter: w, l: l, p: p, r: r, issue: issue}
	}
	next.ServeHTTP(w, r.WithContext(newContext(r.Context(), p)))
}

// keyOf is the key of the sign-in request r (its body readable): Options.Key's,
// or the default key of the Limiter's Scope. An error is errNoKey or the
// client address's (clientaddr.ErrUnreadable).
func (l *Limiter) keyOf(r *http.Request, dev device) (string, error) {
	if l.key != nil {
		key, ok := l.key(r)
		if !ok || key == "" {
			return "", errNoKey
		}
		return key, nil
	}
	u, ok := l.username(r)
	if !ok || u == "" {
		return "", errNoKey
	}
	if l.scope == scopeUsername {
		return "username:" + u, nil
	}
	var client string
	if dev.valid && l.scope == scopePair {
		client = "device:" + dev.idText()
	} else {
		addr, err := l.addrs.Key(r.RemoteAddr, r.Header)
		if err != nil {
			return "", err
		}
		if addr == "" {
			addr = "unknown"
		}
		client = "address:" + addr
	}
	if l.scope == scopeAddress {
		return client, nil
	}
	return pairPrefix(u) + client, nil
}

// pairPrefix is the start of every pair key of username: "pair:", the
// username (or, longer than maxPairUsername bytes, "sha256:" and its
// digest's hex, so that every pair key fits what the table stores as it
// is and Reset finds it by its prefix) and "|". A username that holds "|"
// makes no other username's pair: Reset clears the keys with the prefix
// and no "|" after it (LoginAttemptClearPrefix), and no client part holds
// one.
func pairPrefix(username string) string {
	if len(username) > maxPairUsername {
		sum := sha256.Sum256([]byte(username))
		username = "sha256:" + hex.EncodeToString(sum[:])
	}
	return "pair:" + username + "|"
}

// maxPairUsername is the longest username a pair key holds as it is: with
// "pair:", "|" and the longest client part ("address:" and an IPv6
// prefix, or "device:" and 32 hex digits) the key stays under the 200
// bytes the table stores as they are (internal/keys).
const maxPairUsername = 100

// settle reports an outcome whose failure cannot change the response any
// more; a failed write is logged.
func (l *Limiter) settle(r *http.Request, why string, f func(context.Context) error) {
	if err := f(r.Context()); err != nil {
		l.log.WarnContext(r.Context(), "signin: giving back a reservation failed; it lapses with its window", "why", why, "err", err)
	}
}

// outcomeWriter learns the outcome of an attempt from the status the
// handler writes, before the status reaches the client.
type outcomeWriter struct {
	http.ResponseWriter
	l *Limiter
	p *Permit
	r *http.Request

	// issue, when set, sets the device cookie on a success, before the
	// status goes out.
	issue func(http.Header)

	wroteHeader bool
	swallow     bool // the response was replaced by a 503
}

// Unwrap returns the wrapped ResponseWriter (for http.ResponseController).
func (w *outcomeWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *outcomeWriter) WriteHeader(code int) {
	if w.wroteHeader {
		w.ResponseWriter.WriteHeader(code) // superfluous; net/http logs it
		return
	}
	if code >= 100 && code < 200 {
		w.ResponseWriter.WriteHeader(code) // informational: not the outcome
		return
	}
	w.wroteHeader = true
	ctx := w.r.Context()
	switch {
	case code == http.StatusUnauthorized:
		if err := w.p.Fail(ctx); err != nil {
			// An uncounted failure must not look like a counted one.
			w.swallow = true
			h := w.ResponseWriter.Header()
			for k := range h {
				delete(h, k)
			}
			w.l.log.WarnContext(ctx, "signin: recording a failed sign-in failed; answering 503", "err", err)
			w.l.onError(w.ResponseWriter, w.r, fmt.Errorf("%w: %w", ErrNotRecorded, err))
			return
		}
	case code >= 200 && code < 300:
		if err := w.p.Succeed(ctx); err != nil {
			w.l.log.WarnContext(ctx, "signin: clearing failures after a success failed; they lapse on their own", "err", err)
		}
		if w.issue != nil {
			w.issue(w.ResponseWriter.Header())
		}
	default:
		if err := w.p.Release(ctx); err != nil {
			w.l.log.WarnContext(ctx, "signin: giving back a reservation failed; it lapses with its window", "err", err)
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *outcomeWriter) Write(b []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.swallow {
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}

// Flush flushes the wrapped writer, if it can.
func (w *outcomeWriter) Flush() {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// readBody reads at most limit bytes of r's body.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	return io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
}

// withBody returns a shallow copy of r whose body reads body from the start;
// r itself is never changed.
func withBody(r *http.Request, body []byte) *http.Request {
	c := r.WithContext(r.Context())
	c.Body = io.NopCloser(bytes.NewReader(body))
	c.ContentLength = int64(len(body))
	c.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return c
}

// defaultUsername is the default Options.Username: the normalised
// (NormalizeUsername) field "username" of a JSON object body
// (Content-Type application/json or any +json) or of a form body
// (application/x-www-form-urlencoded or multipart/form-data). A body
// without a Content-Type is read as JSON when it starts with '{', as a
// form otherwise. It never looks at X-Forwarded-For or any other header.
// ok is false when there is no non-empty username: the Handler answers
// 400.
func defaultUsername(r *http.Request) (username string, ok bool) {
	u, err := usernameOf(r)
	if err != nil {
		return "", false
	}
	u = NormalizeUsername(u)
	return u, u != ""
}

// peerAddrs keys the peer's address, the default Options.Addresses.
var peerAddrs, _ = clientaddr.New(clientaddr.Options{})

// addressOf is the key of an address an operator gives Reset: an
// address ("192.0.2.1", "2001:db8::1"), an IPv6 prefix as the key shows
// it ("2001:db8:1:2::/64"), or a key ("address:192.0.2.1"), keyed as
// addrs keys a peer; "" for anything else.
func addressOf(addrs *clientaddr.Resolver, s string) string {
	s = strings.TrimPrefix(strings.TrimSpace(s), "address:")
	if s == "unknown" {
		return s
	}
	if p, err := netip.ParsePrefix(s); err == nil {
		if !p.Addr().Is6() || p.Addr().Is4In6() {
			return "" // an IPv4 client is one address, never a range
		}
		s = p.Masked().Addr().String()
	} else if a, err := netip.ParseAddr(s); err != nil || a.Zone() != "" {
		return ""
	}
	k, _ := addrs.Key(s, nil)
	return k
}

func usernameOf(r *http.Request) (string, error) {
	if r.Body == nil {
		return "", errNoKey
	}
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if mt == "multipart/form-data" {
		if err := r.ParseMultipartForm(32 << 10); err != nil {
			return "", errNoKey
		}
		return r.FormValue("username"), nil
	}
	// A body that is a JSON object is read as JSON whatever its label:
	// curl -d sends JSON labelled as a form, a client may send text/plain,
	// and a handler that decodes such a body anyway must never check a
	// password the throttle did not count. A form body never starts with
	// '{'. Otherwise a form, or no label, is read as a form.
	b, err := io.ReadAll(r.Body)
	if err != nil {
		return "", err
	}
	if t := bytes.TrimSpace(b); len(t) > 0 && t[0] == '{' {
		return jsonUsername(bytes.NewReader(b))
	}
	if mt == "application/x-www-form-urlencoded" || mt == "" {
		return formUsername(bytes.NewReader(b))
	}
	return "", errNoKey
}

// jsonUsername reads the username of a body that is one JSON object and
// nothing more: anything after the object (a second object, garbage) is
// no key, as json.Unmarshal in a handler would refuse it. Other members
// are not looked at: the default key cannot know the handler's schema
// (Options.Key is where an adopter gives its own, stricter parse).
func jsonUsername(body io.Reader) (string, error) {
	var v struct {
		Username *string `json:"username"`
	}
	dec := json.NewDecoder(body)
	if err := dec.Decode(&v); err != nil || v.Username == nil {
		return "", errNoKey
	}
	if _, err := dec.Token(); err != io.EOF {
		return "", errNoKey
	}
	return *v.Username, nil
}

func formUsername(body io.Reader) (string, error) {
	b, err := io.ReadAll(body)
	if err != nil {
		return "", err
	}
	vals, err := url.ParseQuery(string(b))
	if err != nil {
		return "", errNoKey
	}
	return vals.Get("username"), nil
}

// NormalizeUsername is how the default key compares usernames: surrounding
// white space trimmed, compatibility-normalised (NFKC) and Unicode
// case-folded, so "Alice", " alice " and "ALICE" are one key, and so are
// "straße" and "STRASSE".
func NormalizeUsername(s string) string {
	s = strings.TrimSpace(norm.NFKC.String(s))
	// A Caser is stateful: one per call.
	return norm.NFKC.String(cases.Fold().String(s))
}
