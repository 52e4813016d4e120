package signin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/crypto/bcrypt"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/middleware/signin"
)

// Wrap the sign-in handler. The handler checks the password the same way
// for unknown usernames (against a dummy hash) and answers 401 for any bad
// credentials: the throttle learns the outcome from that status. A request
// the throttle cannot identify (no username in its body) never reaches the
// handler: the throttle answers it 400 invalid-sign-in-request.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := pglimit.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}

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

	throttle, err := signin.New(pool, signin.Options{Limit: 2}) // failures per username in 15 minutes
	if err != nil {
		log.Fatal(err)
	}
	handler := throttle.Handler(signIn)

	for _, body := range []string{
		`{"username":"Alice","password":"guess1"}`,
		`{"username":"Alice","password":"guess2"}`,
		`{"username":"Alice","password":"s3cret"}`,
		`{"password":"s3cret"}`,
	} {
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
	// 400 urn:pglimit:problem:invalid-sign-in-request
}

// Callers that are not HTTP handlers (a CLI, a gRPC service) use Acquire
// and report the outcome on the Permit.
func ExampleLimiter_Acquire() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := pglimit.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	throttle, err := signin.New(pool, signin.Options{Limit: 1})
	if err != nil {
		log.Fatal(err)
	}

	for i := 0; i < 2; i++ {
		p, err := throttle.Acquire(ctx, "username:"+signin.NormalizeUsername("Bob"))
		if err != nil {
			fmt.Println("refused:", errors.Is(err, pglimit.ErrLimited))
			continue
		}
		passwordOK := false // ... check the password ...
		if passwordOK {
			_ = p.Succeed(ctx)
		} else if err := p.Fail(ctx); err != nil {
			fmt.Println("cannot count the failure: fail the sign-in")
		}
		fmt.Println("checked")
	}
	// Output:
	// checked
	// refused: true
}

// Two keys: failed sign-ins per client address over every username
// (password spraying) around failed sign-ins per username. The address is
// asked first; a refusal names its scope.
func Example_twoKeys() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := pglimit.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	byUsername, err := signin.New(pool, signin.Options{Limit: 5})
	if err != nil {
		log.Fatal(err)
	}
	// Behind a proxy, give Key: "address:" + a clientaddr.Resolver's key.
	byAddress, err := signin.New(pool, signin.Options{Scope: "address", Limit: 2})
	if err != nil {
		log.Fatal(err)
	}
	wrongPassword := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "invalid credentials", http.StatusUnauthorized)
	})
	handler := byAddress.Handler(byUsername.Handler(wrongPassword))

	for _, username := range []string{"ann", "ben", "cat"} {
		req := httptest.NewRequest(http.MethodPost, "/api/session",
			strings.NewReader(`{"username":"`+username+`","password":"Spring2026"}`))
		req.RemoteAddr = "203.0.113.5:41000"
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		var p struct{ Scope string }
		_ = json.Unmarshal(rec.Body.Bytes(), &p)
		fmt.Println(strings.TrimSpace(fmt.Sprint(rec.Code, " ", p.Scope)))
	}
	// Output:
	// 401
	// 401
	// 429 address
}
