package idemstore_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
)

// The contract every store implements, driven by hand as the middleware
// drives it: an atomic reservation, a completion fenced by the attempt's
// token, and a retry that finds the stored response instead of a lease.
func Example() {
	ctx := context.Background()
	var store idemstore.Store = idemmem.New(nil)
	id := idemstore.Identity{Scope: "tenant-1", Endpoint: "POST /v1/payments", Key: "order-1001"}
	reserve := &idemstore.ReserveParams{
		Identity:          id,
		Fingerprint:       "5d41402abc4b2a76b9719d911017c592", // idem.Fingerprint of the request
		Token:             "attempt-1",                        // a random fencing token per attempt
		Lease:             30 * time.Second,
		TTL:               24 * time.Hour,
		LeaseExpiredState: idemstore.StateUnknown,
	}

	first, err := store.KeyReserve(ctx, reserve)
	if err != nil {
		panic(err)
	}
	fmt.Println("first attempt reserved:", first.Reserved, first.Record.State)

	// ... the operation runs under the lease, then its answer is stored:
	err = store.KeyComplete(ctx, &idemstore.CompleteParams{
		Identity: id,
		Token:    "attempt-1",
		Response: &idemstore.Response{Status: http.StatusCreated, Body: []byte(`{"id":"pay_1"}`)},
	})
	if err != nil {
		panic(err)
	}

	reserve.Token = "attempt-2" // the client's retry
	retry, err := store.KeyReserve(ctx, reserve)
	if err != nil {
		panic(err)
	}
	fmt.Println("retry reserved:", retry.Reserved, retry.Record.State, retry.Record.Response.Status, string(retry.Record.Response.Body))

	// A completion by an attempt that no longer holds the lease is refused.
	err = store.KeyComplete(ctx, &idemstore.CompleteParams{Identity: id, Token: "attempt-2", Response: &idemstore.Response{Status: 500}})
	fmt.Println("stale completion refused:", errors.Is(err, idemstore.ErrLeaseLost))
	// Output:
	// first attempt reserved: true in_progress
	// retry reserved: false completed 201 {"id":"pay_1"}
	// stale completion refused: true
}
