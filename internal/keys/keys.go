// Package keys is the one form in which every pglimit table stores a
// client's key (a username, a token's id, a scope): the key itself when
// PostgreSQL text can hold it (valid UTF-8 without NUL) and it is at most
// 200 bytes, otherwise "sha256:" and the hex of its SHA-256. Distinct keys
// stay distinct, and no client input can make a statement fail.
package keys

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"unicode/utf8"
)

// maxLen bounds the key text stored as it is.
const maxLen = 200

// Stored is key as the tables store it.
func Stored(key string) string {
	if len(key) <= maxLen && utf8.ValidString(key) && !strings.ContainsRune(key, 0) {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:])
}
