package app

import (
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/pglimit/pglimit/ban"
	"github.com/pglimit/pglimit/problem"
)

// The bounds of -ban-after, -ban-within and -ban-for (package ban's Rule).
const (
	banMaxAfter    = 1_000_000
	banMaxDuration = 366 * 24 * time.Hour
)

// setupBans makes the bans of -ban-after, -ban-within and -ban-for (nil
// with -ban-after 0). The rate limits count their refusals toward them
// under the keys user:NAME (the API rate's own key) and address:ADDR.
func (a *App) setupBans() error {
	if a.cfg.BanAfter == 0 {
		return nil
	}
	var err error
	a.bans, err = ban.New(a.primary, ban.Options{After: a.cfg.BanAfter, Within: a.cfg.BanWithin, For: a.cfg.BanFor})
	return err
}

// addressBanKey is the ban key of a client address (the address rate's
// key).
func addressBanKey(addr string) string { return "address:" + addr }

// validBanKey reports whether key is a key the service bans: user:NAME (a
// username: printable, no spaces), token:ID (a token's id) or address:ADDR
// (a client address or an IPv6 prefix as clientaddr gives it, or
// "unknown").
func validBanKey(key string) bool {
	if len(key) > 256 {
		return false
	}
	kind, rest, ok := strings.Cut(key, ":")
	if !ok || rest == "" {
		return false
	}
	switch kind {
	case "user":
		for _, r := range rest {
			if !unicode.IsPrint(r) || unicode.IsSpace(r) {
				return false
			}
		}
		return true
	case "token":
		id, err := strconv.ParseInt(rest, 10, 64)
		return err == nil && id > 0 && strconv.FormatInt(id, 10) == rest
	case "address":
		if rest == "unknown" {
			return true
		}
		if addr, err := netip.ParseAddr(rest); err == nil {
			return addr.String() == rest
		}
		p, err := netip.ParsePrefix(rest)
		return err == nil && p.Masked() == p && p.String() == rest
	}
	return false
}

// handleBanLift is DELETE /api/limits/bans/{key}: an operator lifts a
// ban on every replica within a second (204; 404 when the key is not
// banned; 400 invalid-key for a key that is none of the service's forms).
// Every lift asked for is recorded as an audit event limits.reset.
func (a *App) handleBanLift(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	if !validBanKey(key) {
		badRequest(w, "invalid-key", "Invalid key", "Give the banned key: user:NAME, token:ID or address:ADDR.")
		return
	}
	var lifted bool
	var err error
	if a.bans != nil {
		ctx, cancel := dbContext(r.Context())
		defer cancel()
		lifted, err = a.bans.Lift(ctx, key)
	}
	id, _ := IdentityFrom(r.Context())
	a.auditChange(r, "limits.reset", "ban", map[string]any{"limit": "ban", "key": key, "lifted": lifted}, err)
	switch {
	case err != nil:
		a.dbError(w, r, err)
	case !lifted:
		problem.Write(w, &problem.Details{Slug: "not-found", Title: "Not found", Status: http.StatusNotFound,
			Detail: "This key is not banned."})
	default:
		a.log.InfoContext(r.Context(), "ban lifted", "operator", id.Username, "key", key)
		w.WriteHeader(http.StatusNoContent)
	}
}
