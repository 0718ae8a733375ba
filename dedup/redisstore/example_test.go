package redisstore_test

import (
	"context"
	"fmt"
	"time"

	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/dedup/redisstore"
)

// A first delivery is claimed, forwarded and committed; its retry is a
// duplicate answered from the same claim call. (Not run: it needs a Redis.)
func Example() {
	s, err := redisstore.New(redisstore.Config{
		Addrs: []string{"127.0.0.1:6379"}, // several: Cluster; with MasterName: Sentinel
	}, redisstore.Options{})
	if err != nil {
		panic(err)
	}
	defer s.Close()
	ctx := context.Background()
	key := dedup.Key{Namespace: "stripe", ID: "evt_1NG8Du2eZvKYlo2CzXZ9o6Gu"}

	res, err := s.Claim(ctx, key, dedup.ClaimOptions{Lease: time.Minute})
	if err != nil {
		panic(err) // the route's on_store_error policy decides
	}
	switch res.Outcome {
	case dedup.Claimed:
		// ... forward upstream; on a 2xx:
		err = s.Commit(ctx, key, res.Token, dedup.CommitOptions{Window: 72 * time.Hour, Status: 200})
	case dedup.Duplicate:
		fmt.Println("duplicate, first seen", res.Record.FirstSeen)
	case dedup.InFlight:
		fmt.Println("in flight until", res.Record.LeaseUntil)
	}
	if err != nil {
		panic(err)
	}
}
