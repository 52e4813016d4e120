package quota_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	mquota "github.com/pglimit/pglimit/middleware/quota"
	"github.com/pglimit/pglimit/quota"
)

// Sell 2 requests a month per user: the third is 429 quota-exhausted until
// the 1st.
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
	limiter, err := quota.New(pool, quota.Options{Name: "example-plan", Limit: 2, Period: quota.Month})
	if err != nil {
		log.Fatal(err)
	}
	// Your authentication's answer: who the request's token belongs to.
	sessions := map[string]string{"alice-token": "alice"}
	m, err := mquota.New(mquota.Options{
		Limiter: limiter,
		Policy:  "quota",
		Key: func(r *http.Request) (string, bool) {
			user, ok := sessions[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
			return "user:" + user, ok
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") }))
	for range 3 {
		req := httptest.NewRequest(http.MethodGet, "/api/report", nil)
		req.Header.Set("Authorization", "Bearer alice-token")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		policy := rec.Header().Get("RateLimit-Policy")
		fmt.Println(rec.Code, policy[:strings.Index(policy, ";w=")], strings.Contains(rec.Body.String(), "quota-exhausted"))
	}
	// Output:
	// 200 "quota";q=2 false
	// 200 "quota";q=2 false
	// 429 "quota";q=2 true
}
