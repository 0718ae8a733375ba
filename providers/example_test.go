package providers_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/dedupgw/dedupgw/providers"
)

// Build a Stripe route's provider, then check a delivery's signature before
// taking its key, as the gateway does.
func ExampleNew() {
	now := time.Unix(1700000000, 0)
	p, err := providers.New(providers.Config{
		Provider: providers.Stripe,
		Secrets:  []string{"whsec_test"},
		Now:      func() time.Time { return now },
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	body := []byte(`{"id":"evt_1","type":"invoice.paid"}`)
	mac := hmac.New(sha256.New, []byte("whsec_test"))
	fmt.Fprintf(mac, "%d.%s", now.Unix(), body)
	r := httptest.NewRequest(http.MethodPost, "/webhooks/stripe", strings.NewReader(string(body)))
	r.Header.Set("Stripe-Signature", fmt.Sprintf("t=%d,v1=%s", now.Unix(), hex.EncodeToString(mac.Sum(nil))))

	if err := p.Verifier.Verify(r, body); err != nil {
		fmt.Println("rejected:", err)
		return
	}
	key, err := p.Key(r, body)
	fmt.Println(key, err)

	// A forged copy of the same event is rejected before any key is taken.
	r.Header.Set("Stripe-Signature", fmt.Sprintf("t=%d,v1=%064d", now.Unix(), 0))
	err = p.Verifier.Verify(r, body)
	fmt.Println(errors.Is(err, providers.ErrBadSignature))
	// Output:
	// evt_1 <nil>
	// true
}

// A generic route takes its key from an ordered list of sources.
func ExampleParseKeys() {
	key, err := providers.ParseKeys([]string{"header:Idempotency-Key", "json:data.object.id", "body"})
	if err != nil {
		fmt.Println(err)
		return
	}
	r := httptest.NewRequest(http.MethodPost, "/hooks/orders", nil)
	fmt.Println(key(r, []byte(`{"data":{"object":{"id":"ord_42"}}}`)))
	r.Header.Set("Idempotency-Key", "k-1")
	fmt.Println(key(r, []byte(`{"data":{"object":{"id":"ord_42"}}}`)))
	// Output:
	// ord_42 <nil>
	// k-1 <nil>
}

// The same logical JSON, with other key order and spacing, has one body key.
func ExampleCanonical() {
	a, _ := providers.Canonical([]byte("{\n  \"b\": [1, 2.0],\n  \"a\": \"\\u00e9\"\n}"))
	fmt.Println(string(a))
	fmt.Println(providers.BodyKey([]byte(`{"a":"é","b":[1,2.0]}`)) == providers.BodyKey(a))
	// Output:
	// {"a":"é","b":[1,2.0]}
	// true
}

// A config loader prefixes validation errors with the route.
func ExampleValidateKeys() {
	err := providers.ValidateKeys([]string{"json:id", "foo:bar"})
	fmt.Println(fmt.Errorf("routes[%d].%w", 2, err))
	// Output:
	// routes[2].keys[1]: unknown source "foo:bar"
}
