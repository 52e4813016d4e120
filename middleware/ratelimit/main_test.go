package ratelimit_test

import (
	"testing"

	"github.com/pglimit/pglimit/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.MainWithExampleDatabase(m) }
