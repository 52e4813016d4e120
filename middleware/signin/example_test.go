package signin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/crypto/bcrypt"

	"github.com/pglimit/pglimit/internal/pgtest"
	"github.com/pglimit/pglimit/middleware/signin"
)

// Wrap the sign-in handler. The handler checks the password the same way
// for unknown usernames (against a dummy hash) and answers 401 for any bad
// credentials: the throttle learns the outcome from that status.
func Example() {
	url, drop := pgtest.ForExample()
	defer drop()
	pool, _ := pgxpool.New(context.Background(), url)
	defer pool.Close()

	aliceHash, _ := bcrypt.GenerateFromPassword([]byte("s3cret"), bcrypt.MinCost)
	dummyHash, _ := bcrypt.GenerateFromPassword([]byte("no user has this"), bcrypt.MinCost)
	users := map[string][]byte{"alice": aliceHash}

	signIn := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Username, Password string }
		_ = json.NewDecoder(r.Body).Decode(&req)
		hash, known := users[signin.NormalizeUsername(req.Username)]
		if !known {
			hash = dummyHash // same work as for a known user
		}
		if bcrypt.CompareHashAndPassword(hash, []byte(req.Password)) != nil || !known {
			http.Error(w, "invalid credentials", http.StatusUnauthorized)
			return
		}
		fmt.Fprintln(w, `{"token":"..."}`)
	})

	throttle, _ := signin.New(pool, signin.Options{MaxFailures: 2})
	handler := throttle.Handler(signIn)

	for _, password := range []string{"guess1", "guess2", "s3cret"} {
		body := fmt.Sprintf(`{"username":"Alice","password":%q}`, password)
		req := httptest.NewRequest(http.MethodPost, "/api/session", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		var p struct{ Type string }
		_ = json.Unmarshal(rec.Body.Bytes(), &p)
		fmt.Println(strings.TrimSpace(fmt.Sprint(rec.Code, " ", p.Type)))
	}
	// Output:
	// 401
	// 401
	// 429 urn:pglimit:problem:too-many-failed-sign-ins
}

// Callers that are not HTTP handlers (a CLI, a gRPC service) use Check and
// report the outcome on the Attempt.
func ExampleLimiter_Check() {
	url, drop := pgtest.ForExample()
	defer drop()
	pool, _ := pgxpool.New(context.Background(), url)
	defer pool.Close()
	throttle, _ := signin.New(pool, signin.Options{MaxFailures: 1})
	ctx := context.Background()

	for i := 0; i < 2; i++ {
		attempt, err := throttle.Check(ctx, "username:"+signin.NormalizeUsername("Bob"))
		if err != nil {
			fmt.Println("refused:", err != nil)
			continue
		}
		passwordOK := false // ... check the password ...
		if passwordOK {
			_ = attempt.Succeeded(ctx)
		} else if err := attempt.RecordFailure(ctx); err != nil {
			fmt.Println("cannot count the failure: fail the sign-in")
		}
		fmt.Println("checked")
	}
	// Output:
	// checked
	// refused: true
}
