package rules_test

import (
	"testing"

	"github.com/pglimit/pglimit/harness/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }
