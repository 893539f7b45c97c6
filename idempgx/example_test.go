package idempgx_test

import (
	"context"
	"log"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idempgx"
)

// Example wires the store under the middleware in transactional mode: the
// handler's insert and the key's completion commit together.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db.internal/payments")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	store := idempgx.New(pool, &idempgx.Config{Schema: "idem"})
	defer store.Close()
	if _, err := store.Migrate(ctx); err != nil { // or: idem migrate up
		log.Fatal(err)
	}

	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/payments", func(w http.ResponseWriter, r *http.Request) {
		tx, err := idempgx.TxFromContext(r.Context())
		if err != nil {
			http.Error(w, "internal error", http.StatusInternalServerError)
			return
		}
		if _, err := tx.Exec(r.Context(), "INSERT INTO payments (amount_cents) VALUES (1000)"); err != nil {
			http.Error(w, "internal error", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	protect := idem.New(store, &idem.Config{GuardConfig: idem.GuardConfig{Transactional: true}})
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", protect(mux)))
}
