package app

import (
	"net/http"
	"time"
)

// writeStall is how long any response may wait for its client to take its
// next bytes. Every write of every response has a deadline this far ahead,
// set again before each part, so the deadline moves with progress: a
// client that stops reading is dropped after writeStall, its handler's
// write fails and the handler returns what it held (a console or export
// permit, an in-flight slot), while a long answer read steadily (an
// export of a minute) is never cut.
const writeStall = 10 * time.Second

// writePart is the largest part of a write sent under one deadline.
const writePart = 64 << 10

// withWriteDeadline gives every response of h a write deadline that moves
// with its progress (writeStall); the server sets none (no WriteTimeout,
// which would be one fixed deadline for the whole request).
func withWriteDeadline(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pw := &progressWriter{ResponseWriter: w, rc: http.NewResponseController(w)}
		pw.extend()
		// The server flushes what the handler left buffered after it
		// returns: that has a deadline too.
		defer pw.extend()
		h.ServeHTTP(pw, r)
	})
}

// progressWriter sets the write deadline before each part it writes and
// each flush.
type progressWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
}

func (p *progressWriter) extend() { _ = p.rc.SetWriteDeadline(time.Now().Add(writeStall)) }

func (p *progressWriter) Write(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		part := b[:min(len(b), writePart)]
		p.extend()
		m, err := p.ResponseWriter.Write(part)
		n += m
		if err != nil {
			return n, err
		}
		b = b[len(part):]
	}
	return n, nil
}

// FlushError flushes under a fresh deadline (http.ResponseController.Flush).
func (p *progressWriter) FlushError() error {
	p.extend()
	return p.rc.Flush()
}

// Flush is FlushError for an http.Flusher.
func (p *progressWriter) Flush() { _ = p.FlushError() }

// Unwrap gives http.ResponseController the server's writer.
func (p *progressWriter) Unwrap() http.ResponseWriter { return p.ResponseWriter }
