package ratelimit_test

import (
	"testing"

	"github.com/pglimit/pglimit/internal/harness/pgtest"
)

func TestMain(m *testing.M) { pgtest.MainWithExampleDatabase(m) }
