// Package db is pglimit's generated data layer: the Go that sqlc compiles
// from the statements in sql/queries, which the library's engines run. It
// is not an API. Its names and types follow the SQL and change with it,
// without notice or a major version; a service uses the limiters, whose
// packages are the API. (This file is the one in db/ written by hand; the
// rest is sqlc's output, never edited.)
package db
