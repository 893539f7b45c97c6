package idemmaint_test

import (
	"fmt"

	"github.com/idem-dev/idem/idemmaint"
	"github.com/idem-dev/idem/idemstore"
)

// The lookup URL of the README's worked example: every value is one
// percent-encoded path segment or query value.
func ExampleURLTemplate_Expand() {
	t, err := idemmaint.ParseURLTemplate("http://orders.internal:9000/v1/orders/by-idempotency-key/{key}?route={method}%20{path}")
	if err != nil {
		panic(err)
	}
	u, err := t.Expand(idemstore.Identity{Endpoint: "POST /v1/orders", Key: "7f3a/2"})
	if err != nil {
		panic(err)
	}
	fmt.Println(u)
	_, err = idemmaint.ParseURLTemplate("http://orders.internal:9000/v1/orders/{id}")
	fmt.Println(err)
	// Output:
	// http://orders.internal:9000/v1/orders/by-idempotency-key/7f3a%2F2?route=POST%20%2Fv1%2Forders
	// unknown placeholder {id}: want {key}, {method}, {path} or {scope}
}
