// Package problem writes RFC 9457 problem details (application/problem+json)
// for every refusal pglimit makes, with Retry-After when a retry can
// succeed. A service writes its own refusals with it to answer in the same
// shape.
//
// What it guarantees: a body's "type" is TypeBase followed by a short,
// stable slug ("urn:pglimit:problem:too-many-heavy-requests"), so clients
// can match on the part after the last ':' or '/'; "type", "title" and
// "status" come first, then "detail" and "instance" when set, then the
// extension members at the top level of the object, as the RFC asks, in
// name order, never in the place of a standard member. The response says
// Content-Type application/problem+json, Cache-Control no-store and
// X-Content-Type-Options nosniff, and Retry-After in whole seconds,
// rounded up, when the problem gives a wait. Internal error text is never
// part of a body: a server error is written with Internal, which sends a
// generic detail.
//
// What it costs: one JSON encoding of a small object per refusal; nothing
// is kept between calls.
//
// How it fails: an extension member that cannot be encoded as JSON is a
// programming error, and the client still gets the problem, without the
// extension members. An error writing to the client (one that went away)
// is ignored.
//
// The package only writes: it classifies no error and logs nothing. Each
// middleware's WriteError decides which problem an error is (with
// pglimit.Classify for database errors) and logs through the Logger its
// caller configured.
package problem

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/pglimit/pglimit/internal/retryafter"
)

// TypeBase prefixes every problem type slug to make the type URI.
const TypeBase = "urn:pglimit:problem:"

// mediaType is the content type of a problem details body.
const mediaType = "application/problem+json"

// Details is one problem details object.
type Details struct {
	// Slug is the stable problem type name, e.g. "too-many-heavy-requests".
	// The JSON "type" member is TypeBase + Slug.
	Slug string
	// Title is a short, human-readable summary of the problem type.
	Title string
	// Status is the HTTP status code.
	Status int
	// Detail explains this occurrence, for a human.
	Detail string
	// Instance identifies this occurrence (optional), e.g. the request path.
	Instance string
	// RetryAfter, when positive, is sent as the Retry-After header in whole
	// seconds, rounded up, at least 1.
	RetryAfter time.Duration
	// Extensions are extra top-level members (endpoint, limit, scope, ...).
	// Those named type, title, status, detail or instance are left out.
	Extensions map[string]any
	// Header holds extra response headers (RateLimit-Policy, RateLimit).
	// They are added to the fields the response already has, not put in
	// their place: the RateLimit fields are lists that may span several
	// field lines, and an outer limit's items (a rate limit's, set before
	// the handler ran) stay beside the refusing limit's.
	Header http.Header
}

// body is what Write sends: the standard members first, then the
// extensions in name order.
func (d *Details) body() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	write := func(k string, v any) error {
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		kb, _ := json.Marshal(k)
		b.Write(kb)
		b.WriteByte(':')
		vb, err := json.Marshal(v)
		if err != nil {
			return err
		}
		b.Write(vb)
		return nil
	}
	_ = write("type", TypeBase+d.Slug)
	_ = write("title", d.Title)
	_ = write("status", d.Status)
	if d.Detail != "" {
		_ = write("detail", d.Detail)
	}
	if d.Instance != "" {
		_ = write("instance", d.Instance)
	}
	keys := make([]string, 0, len(d.Extensions))
	for k := range d.Extensions {
		switch k {
		case "type", "title", "status", "detail", "instance":
			continue
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if err := write(k, d.Extensions[k]); err != nil {
			return nil, err
		}
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// Write sends d as the response: its status, its headers beside those the
// response already has, and its body.
func Write(w http.ResponseWriter, d *Details) {
	body, err := d.body()
	if err != nil {
		// An extension that cannot be encoded is a programming error; the
		// client still gets the problem, without extensions.
		plain := *d
		plain.Extensions = nil
		body, _ = plain.body()
	}
	h := w.Header()
	for k, vs := range d.Header {
		h[k] = append(h[k], vs...)
	}
	h.Set("Content-Type", mediaType)
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	if d.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(retryafter.Seconds(d.RetryAfter)))
	}
	h.Del("Content-Length")
	w.WriteHeader(d.Status)
	_, _ = w.Write(body)
	_, _ = w.Write([]byte("\n"))
}

// Internal sends a 500 internal-error whose body says only that the server
// failed. It never carries the error's text; log the error yourself,
// through your logger, before calling it.
func Internal(w http.ResponseWriter, _ *http.Request) {
	Write(w, &Details{
		Slug:   "internal-error",
		Title:  "Internal server error",
		Status: http.StatusInternalServerError,
		Detail: "The server could not complete the request. It has been logged.",
	})
}
