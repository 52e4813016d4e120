package app

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"path"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/pglimit/cmd/studio/internal/studiodb"
	mquota "github.com/pglimit/pglimit/middleware/quota"
	"github.com/pglimit/pglimit/problem"
)

// handlePlugin stores an uploaded plugin (POST /api/plugins, multipart
// field "file") behind the upload window: 201 {"id","name","size","sha256"}.
// A bad file is 400, a content the user stored already 409
// duplicate-plugin, a plugin past the user's month of plugin bytes 429
// quota-exhausted; each, as every non-2xx answer, gives the user's upload
// slot back and charges no bytes.
func (a *App) handlePlugin(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, a.cfg.MaxUploadBytes+64<<10)
	file, header, err := r.FormFile("file")
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			problem.Write(w, &problem.Details{Slug: "request-too-large", Title: "Request too large", Status: http.StatusRequestEntityTooLarge,
				Detail: "The plugin is larger than this service accepts.", Extensions: map[string]any{"limit": a.cfg.MaxUploadBytes}})
			return
		}
		badRequest(w, "invalid-plugin", "Invalid plugin", "Send the plugin as multipart/form-data in the field \"file\".")
		return
	}
	defer file.Close()
	name := path.Base(strings.ReplaceAll(header.Filename, "\\", "/"))
	if name == "" || name == "." || name == "/" || len(name) > 200 || !utf8.ValidString(name) || strings.ContainsAny(name, "\x00\r\n") {
		badRequest(w, "invalid-plugin", "Invalid plugin", "The file needs a plain name of at most 200 characters.")
		return
	}
	content, err := io.ReadAll(io.LimitReader(file, a.cfg.MaxUploadBytes+1))
	if err != nil {
		badRequest(w, "invalid-plugin", "Invalid plugin", "The file could not be read.")
		return
	}
	if int64(len(content)) > a.cfg.MaxUploadBytes {
		problem.Write(w, &problem.Details{Slug: "request-too-large", Title: "Request too large", Status: http.StatusRequestEntityTooLarge,
			Detail: "The plugin is larger than this service accepts.", Extensions: map[string]any{"limit": a.cfg.MaxUploadBytes}})
		return
	}
	if len(content) == 0 {
		badRequest(w, "invalid-plugin", "Invalid plugin", "The file is empty.")
		return
	}
	sum := sha256.Sum256(content)
	digest := hex.EncodeToString(sum[:])
	id, _ := IdentityFrom(r.Context())
	ctx, cancel := dbContext(r.Context())
	defer cancel()
	// One transaction stores the plugin and debits the user's month of
	// plugin bytes (-plugin-bytes-per-month, on the logged ledger): both
	// commit, or neither. A content the user stored already inserts
	// nothing and charges nothing (409); a debit past the quota rolls the
	// plugin back (429).
	tx, err := a.primary.Begin(ctx)
	if err != nil {
		a.dbError(w, r, err)
		return
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	pid, err := a.q.PluginCreate(ctx, tx, &studiodb.PluginCreateParams{
		UserID: id.UserID, Name: name, Size: int64(len(content)), Sha256: digest, Content: content,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		problem.Write(w, &problem.Details{Slug: "duplicate-plugin", Title: "Duplicate plugin", Status: http.StatusConflict,
			Detail:     "You have stored a plugin with this content already; it is stored and charged once.",
			Extensions: map[string]any{"sha256": digest}})
		return
	}
	if err != nil {
		a.dbError(w, r, err)
		return
	}
	if l := a.quotas.pluginBytes; l != nil {
		p, err := l.ChargeTx(ctx, tx, quotaKey(id.Username), int64(len(content)))
		if err != nil {
			a.quotaError(w, r, err)
			return
		}
		mquota.SetHeaders(w.Header(), policyPluginBytes, p.State)
	}
	if err := tx.Commit(ctx); err != nil {
		a.dbError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{"id": pid, "name": name, "size": len(content), "sha256": digest})
}
