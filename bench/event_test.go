package main

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"
)

func TestAppendEventIsStripeShapedJSON(t *testing.T) {
	id := newIDSpace().newID()
	body := appendEvent(nil, []byte(id))
	var ev struct {
		ID     string `json:"id"`
		Object string `json:"object"`
		Type   string `json:"type"`
	}
	if err := json.Unmarshal(body, &ev); err != nil {
		t.Fatalf("event is not JSON: %v", err)
	}
	if ev.ID != id || ev.Object != "event" || ev.Type != "payment_intent.succeeded" {
		t.Errorf("got id %q object %q type %q, want id %q object event type payment_intent.succeeded", ev.ID, ev.Object, ev.Type, id)
	}
	if n := len(body); n < 900 || n > 1150 {
		t.Errorf("got %d bytes, want about 1 KiB (900..1150)", n)
	}
	if !strings.HasPrefix(id, "evt_") || len(id) != len("evt_")+24 {
		t.Errorf("got id %q, want evt_ and 24 characters like a Stripe event ID", id)
	}
}

func TestIDSpaceNeverRepeats(t *testing.T) {
	s := newIDSpace()
	const senders, each = 8, 1000
	ids := make([][]string, senders)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Go(func() {
			for range each {
				ids[i] = append(ids[i], s.newID())
			}
		})
	}
	wg.Wait()
	seen := map[string]bool{}
	for _, l := range ids {
		for _, id := range l {
			if seen[id] {
				t.Fatalf("got id %q twice, want every id once", id)
			}
			seen[id] = true
		}
	}
	if got, want := len(seen), senders*each; got != want {
		t.Errorf("got %d ids, want %d", got, want)
	}
	if other := newIDSpace().newID(); seen[other] {
		t.Errorf("got id %q from a second id space, want a fresh one", other)
	}
}

func TestSequenceFollowsWorkload(t *testing.T) {
	// Each pattern letter stands for an ID, in order of first appearance.
	tests := []struct {
		workload string
		want     string
	}{
		{Unique, "ABCDEF"},
		{Duplicate, "AAAAAA"},
		{Mix, "AABBCC"},
	}
	for _, tt := range tests {
		t.Run(tt.workload, func(t *testing.T) {
			ids := newIDSpace()
			seq := newSequence(tt.workload, ids, ids.newID())
			letters := map[string]byte{}
			var got []byte
			for range len(tt.want) {
				var ev struct{ ID string }
				if err := json.Unmarshal(seq.next(), &ev); err != nil {
					t.Fatalf("body is not JSON: %v", err)
				}
				l, ok := letters[ev.ID]
				if !ok {
					l = byte('A' + len(letters))
					letters[ev.ID] = l
				}
				got = append(got, l)
			}
			if string(got) != tt.want {
				t.Errorf("got ID pattern %s, want %s", got, tt.want)
			}
		})
	}
}
