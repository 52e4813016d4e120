package app

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/pglimit/pglimit/problem"
)

// decodeJSON reads one JSON object of at most limit bytes into v, whatever
// the Content-Type says (curl -d sends a form type). Bad input is answered
// 400 (invalid-json) or 413 (request-too-large) and decodeJSON returns
// false.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any, limit int64) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			problem.Write(w, &problem.Details{Slug: "request-too-large", Title: "Request too large", Status: http.StatusRequestEntityTooLarge,
				Detail: "The request body is larger than this endpoint accepts.", Extensions: map[string]any{"limit": limit}})
			return false
		}
		// Whatever is left of the body is not waited for: the connection
		// closes after this answer (else net/http would read the rest of a
		// body that is still trickling in before answering).
		w.Header().Set("Connection", "close")
		badRequest(w, "invalid-json", "Invalid JSON", "The request body could not be read.")
		return false
	}
	if !utf8.Valid(body) {
		badRequest(w, "invalid-json", "Invalid JSON", "The request body is not valid UTF-8.")
		return false
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		badRequest(w, "invalid-json", "Invalid JSON", "The request body is not the JSON object this endpoint takes.")
		return false
	}
	if dec.More() {
		badRequest(w, "invalid-json", "Invalid JSON", "The request body holds more than one JSON value.")
		return false
	}
	return true
}

// writeJSON sends v as the response.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	_ = enc.Encode(v)
}
