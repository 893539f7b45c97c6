package idem_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
)

// Call a function twice with one key: it runs once, and the second call
// returns the stored result. The same key with another payload is refused.
func ExampleDo() {
	guard := idem.NewGuard(idemmem.New(nil), nil)
	ctx := context.Background()
	charge := func(ctx context.Context) (string, error) {
		fmt.Println("charging")
		return "ch_1", nil
	}
	for _, cents := range []int{500, 500, 700} {
		id, err := idem.Do(ctx, guard, "order-42", "charge", map[string]int{"amount_cents": cents}, charge)
		fmt.Println(id, errors.Is(err, idem.ErrKeyReused))
	}
	// Output:
	// charging
	// ch_1 false
	// ch_1 false
	//  true
}

// Run is what adapters build on: the result is opaque bytes plus a status
// and metadata of the adapter's choosing.
func ExampleGuard_Run() {
	guard := idem.NewGuard(idemmem.New(nil), nil)
	call := idem.Call{
		Identity:    idemstore.Identity{Scope: "tenant-a", Endpoint: "/shop.Orders/Create", Key: "req-7"},
		Fingerprint: idem.FingerprintBytes("/shop.Orders/Create", []byte("\x08\x2a")),
	}
	for range 2 {
		res, replayed, err := guard.Run(context.Background(), call, func(ctx context.Context) (idem.Result, error) {
			return idem.Result{Status: 200, Meta: map[string][]string{"order-id": {"42"}}, Body: []byte("\x08\x2a")}, nil
		})
		fmt.Println(res.Status, res.Meta["order-id"], replayed, err)
	}
	// Output:
	// 200 [42] false <nil>
	// 200 [42] true <nil>
}
