package redisstore_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/dedup/redisstore"
	"github.com/dedupgw/dedupgw/dedup/redisstore/redistest"
	"github.com/dedupgw/dedupgw/dedup/storetest"
)

// listAll follows every page of a listing and returns the IDs listed,
// sorted, each once.
func listAll(t *testing.T, s dedup.Store, namespace string, opts dedup.ListOptions) []string {
	t.Helper()
	var ids []string
	for _, e := range storetest.ListAll(t, s, namespace, opts) {
		ids = append(ids, e.ID)
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// A listing through Sentinel scans the master the sentinels name.
func TestListViaSentinel(t *testing.T) {
	st := redistest.StartSentinel(t)
	s := newStore(t, redisstore.Config{Addrs: []string{st.Sentinel.Addr()}, MasterName: st.MasterName}, nil)
	want := []string{"evt_1", "evt_2", "evt_3"}
	for _, id := range want {
		claimCommit(t, s, dedup.Key{Namespace: "stripe", ID: id})
	}
	if got := listAll(t, s, "stripe", dedup.ListOptions{Limit: 1}); !slices.Equal(got, want) {
		t.Errorf("List via Sentinel: got %q, want %q", got, want)
	}
}

// IDs stored by their SHA-256 cannot be given back: they are left out,
// and the literal IDs beside them are all listed. Keys of other prefixes
// sharing the database are never listed.
func TestListLeavesOutHashedIDs(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, redisstore.Config{Addrs: []string{srv.Addr()}}, nil)
	other := newStore(t, redisstore.Config{Addrs: []string{srv.Addr()}}, nil)
	for _, id := range []string{"evt_1", "evt_2", strings.Repeat("x", 201), "{tag}evt", "#evt", "with space"} {
		claimCommit(t, s, dedup.Key{Namespace: "ns", ID: id})
		claimCommit(t, other, dedup.Key{Namespace: "ns", ID: id + "_other"})
	}
	if got, want := listAll(t, s, "ns", dedup.ListOptions{Limit: 2}), []string{"evt_1", "evt_2"}; !slices.Equal(got, want) {
		t.Errorf("List: got %q, want %q", got, want)
	}
}

// A cursor naming a Cluster master that is no longer one fails with
// ErrBadCursor and says to start again, instead of skipping that master.
func TestListClusterCursorOfAnotherMaster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	s := newStore(t, redisstore.Config{Addrs: cl.Addrs()}, nil)
	for _, id := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		claimCommit(t, s, dedup.Key{Namespace: "ns", ID: id})
	}
	page, err := s.List(context.Background(), "ns", dedup.ListOptions{Limit: 1})
	if err != nil || page.Next == "" {
		t.Fatalf("List: got (%+v, %v), want a first page with a Next", page, err)
	}
	// The cursor is opaque to callers; the test swaps the master it names.
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(page.Next, "r"))
	var cur map[string]any
	if err != nil || json.Unmarshal(b, &cur) != nil || cur["n"] == nil {
		t.Fatalf("cursor %q: got (%s, %v), want base64url JSON naming a master", page.Next, b, err)
	}
	cur["n"] = "127.0.0.1:1"
	b, _ = json.Marshal(cur)
	forged := "r" + base64.RawURLEncoding.EncodeToString(b)
	_, err = s.List(context.Background(), "ns", dedup.ListOptions{Limit: 1, Cursor: forged})
	if !errors.Is(err, dedup.ErrBadCursor) || !strings.Contains(err.Error(), "start the listing again") {
		t.Errorf("List with a cursor of a gone master: got %v, want ErrBadCursor saying to start again", err)
	}
}
