package idemmysql_test

import (
	"context"
	"log"
	"net/http"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmysql"
)

// The MySQL (or MariaDB) store behind the middleware, in transactional
// mode: the handler's writes and the key's completion commit in one
// transaction. (It needs a server, so it is compiled, not run, by go test.)
func Example() {
	ctx := context.Background()
	// The driver's DSN; `idem` commands take mysql://user:pass@host:3306/db.
	store, err := idemmysql.Open(ctx, "idem:secret@tcp(127.0.0.1:3306)/shop", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if _, err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	protect := idem.New(store, &idem.Config{RequireKey: true, GuardConfig: idem.GuardConfig{Transactional: true}})
	http.Handle("POST /v1/orders", protect(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := idemmysql.TxFromContext(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if _, err := tx.ExecContext(r.Context(), "INSERT INTO orders (amount_cents) VALUES (500)"); err != nil {
			http.Error(w, "could not place the order", http.StatusServiceUnavailable) // rolled back, key released
			return
		}
		w.WriteHeader(http.StatusCreated)
	})))
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", nil))
}
