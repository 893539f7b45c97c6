package idemredis_test

import (
	"log"
	"net/http"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemredis"
)

// Any redis.UniversalClient works: a single node, Sentinel
// (redis.NewFailoverClient) or Redis Cluster (redis.NewClusterClient).
func ExampleNew() {
	client := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"},
	})
	defer client.Close()
	store := idemredis.New(client, &idemredis.Config{Prefix: "payments:idem:"})

	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/payments", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})
	handler := idem.New(store, nil)(mux)
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", handler))
}
