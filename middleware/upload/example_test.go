package upload_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/middleware/upload"
)

// Wrap the upload handler. A file the handler rejects (4xx) gives its slot
// back; a stored one (2xx) keeps it for the rolling window.
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

	// Your authentication's answer: who the request's token belongs to.
	// Never a header the client sets: the key is whose uploads are counted.
	sessions := map[string]string{"alice-token": "alice"}
	userOf := func(r *http.Request) (string, bool) {
		user, ok := sessions[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
		return user, ok
	}
	limiter, err := upload.New(pool, upload.Options{
		Key:   userOf,
		Limit: 2, // per user in any hour (the default window)
	})
	if err != nil {
		log.Fatal(err)
	}
	handler := limiter.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		file, _ := io.ReadAll(r.Body)
		if string(file) == "not a plugin" {
			http.Error(w, "invalid plugin", http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))

	for _, file := range []string{"plugin-a", "not a plugin", "plugin-b", "plugin-c"} {
		req := httptest.NewRequest(http.MethodPost, "/api/plugins", strings.NewReader(file))
		req.Header.Set("Authorization", "Bearer alice-token")
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		fmt.Println(file, rec.Code)
	}
	// Output:
	// plugin-a 201
	// not a plugin 400
	// plugin-b 201
	// plugin-c 429
}
