package main

import (
	"crypto/rand"
	"strconv"
	"sync/atomic"
)

// Workload names accepted by -workloads.
const (
	Unique    = "unique"    // every event new
	Duplicate = "duplicate" // one event over and over, primed once before the round
	Mix       = "mix"       // every event twice: a new one, then the same again
)

// eventHead and eventTail surround the event ID in a Stripe-shaped
// payment_intent.succeeded event of about 1 KiB. Only the top-level "id" varies;
// it is what the stripe preset keys on (json:id).
const (
	eventHead = `{"id":"`
	eventTail = `","object":"event","api_version":"2024-06-20","created":1718031337,` +
		`"data":{"object":{"id":"pi_3PQ8Du2eZvKYlo2C1x9mYfVb","object":"payment_intent",` +
		`"amount":2000,"amount_capturable":0,"amount_details":{"tip":{}},"amount_received":2000,` +
		`"confirmation_method":"automatic",` +
		`"created":1718031330,"currency":"usd","customer":"cus_Q9x2LrT0aBcDeF",` +
		`"description":"Order #6735","invoice":null,"last_payment_error":null,` +
		`"latest_charge":"ch_3PQ8Du2eZvKYlo2C1Yq2wZr8","livemode":false,` +
		`"metadata":{"order_id":"6735","cart":"c_81f2"},"next_action":null,"on_behalf_of":null,` +
		`"payment_method_types":["card"],"processing":null,"receipt_email":"jenny.rosen@example.com",` +
		`"review":null,"setup_future_usage":null,"shipping":null,"source":null,"status":"succeeded",` +
		`"payment_method":"pm_1PQ8Dt2eZvKYlo2CkLxQ7bNs","capture_method":"automatic",` +
		`"transfer_data":null,"transfer_group":null}},"livemode":false,"pending_webhooks":1,` +
		`"request":{"id":"req_8kQ2Zc3vYtW1xS","idempotency_key":"6c1f0d4e-5b7a-4e2b-9d8c-3a2f1e0b9c7d"},` +
		`"type":"payment_intent.succeeded"}`
)

// idSpace hands out event IDs that are unique within one run of the runner:
// "evt_" + a random run tag + a base-36 sequence number, the length and
// alphabet of a real Stripe event ID. It is safe for concurrent use.
type idSpace struct {
	tag  string
	next atomic.Uint64
}

// newIDSpace returns an idSpace with a fresh random tag, so IDs never collide
// with those of an earlier run against a store that outlived it.
func newIDSpace() *idSpace {
	return &idSpace{tag: rand.Text()[:8]}
}

// appendNew appends a new, never handed out ID to dst.
func (s *idSpace) appendNew(dst []byte) []byte {
	n := s.next.Add(1)
	dst = append(dst, "evt_"...)
	dst = append(dst, s.tag...)
	const width = 16
	var num [width]byte
	b := strconv.AppendUint(num[:0], n, 36)
	for range width - len(b) {
		dst = append(dst, '0')
	}
	return append(dst, b...)
}

// newID returns a new ID as a string.
func (s *idSpace) newID() string { return string(s.appendNew(nil)) }

// appendEvent appends the JSON event with the given ID to dst.
func appendEvent(dst []byte, id []byte) []byte {
	dst = append(dst, eventHead...)
	dst = append(dst, id...)
	return append(dst, eventTail...)
}

// sequence produces the bodies one sender posts under a workload. Each sender
// owns its sequence; sequences share the run's idSpace. It is not safe for
// concurrent use.
type sequence struct {
	workload string
	ids      *idSpace
	fixed    []byte // the one ID of a duplicate round
	id       []byte // the current ID
	body     []byte // reused body buffer
	repeat   bool   // mix: the next body repeats the current ID
}

// newSequence returns the sequence of a sender. For Duplicate, fixedID is the
// round's one event ID; it is ignored otherwise.
func newSequence(workload string, ids *idSpace, fixedID string) *sequence {
	return &sequence{workload: workload, ids: ids, fixed: []byte(fixedID)}
}

// next returns the next body to post. The slice is valid until the next call.
func (s *sequence) next() []byte {
	switch s.workload {
	case Duplicate:
		s.id = s.fixed
	case Mix:
		if !s.repeat {
			s.id = s.ids.appendNew(s.id[:0])
		}
		s.repeat = !s.repeat
	default: // Unique
		s.id = s.ids.appendNew(s.id[:0])
	}
	s.body = appendEvent(s.body[:0], s.id)
	return s.body
}
