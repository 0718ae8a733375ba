package main

import (
	"crypto/hmac"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"hash"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupgw/dedupgw/dedup/memstore"
	"github.com/dedupgw/dedupgw/providers"
	"github.com/dedupgw/dedupgw/proxy"
)

// readmeRecipes returns the YAML snippets of the README's "Recipes for other
// providers" section, by route name.
func readmeRecipes(t *testing.T) map[string]string {
	t.Helper()
	section := readmeSection(t, "#### Recipes for other providers")
	name := regexp.MustCompile(`(?m)^  - name: (\S+)$`)
	recipes := map[string]string{}
	for _, m := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(section, -1) {
		n := name.FindStringSubmatch(m[1])
		if n == nil {
			t.Fatalf("README recipe without a route name:\n%s", m[1])
		}
		recipes[n[1]] = m[1]
	}
	return recipes
}

func macOf(h func() hash.Hash, key, content string) []byte {
	m := hmac.New(h, []byte(key))
	m.Write([]byte(content))
	return m.Sum(nil)
}

// recipeDelivery is a delivery signed as a provider documents, for one
// README recipe.
type recipeDelivery struct {
	env     map[string]string
	replace [2]string // a placeholder of the snippet and the value the delivery was signed for
	now     int64     // Unix seconds
	headers map[string]string
	body    string
	wantKey string // "" for a route keyed on the body: any key
	// tampered are changes to the delivery that must fail verification.
	tampered map[string]func(headers map[string]string, body string) (map[string]string, string)
}

// changeBody flips the body's last byte before its closing brace.
func changeBody(h map[string]string, body string) (map[string]string, string) {
	i := strings.LastIndexByte(body, '}') - 1
	return h, body[:i] + string(body[i]^1) + body[i+1:]
}

func changeHeader(name, value string) func(map[string]string, string) (map[string]string, string) {
	return func(h map[string]string, body string) (map[string]string, string) {
		h = maps.Clone(h)
		h[name] = value
		return h, body
	}
}

// replaceInHeader replaces old with new in the header name: an item of a
// structured signature header.
func replaceInHeader(name, old, new string) func(map[string]string, string) (map[string]string, string) {
	return func(h map[string]string, body string) (map[string]string, string) {
		return changeHeader(name, strings.Replace(h[name], old, new, 1))(h, body)
	}
}

func recipeDeliveries() map[string]recipeDelivery {
	// Linear: the body of the SDK's own test (linear/linear,
	// packages/sdk/src/_tests/LinearWebhooks.test.ts) as JSON.stringify
	// writes it, signed as packages/sdk/src/webhooks/client.ts verifies:
	// hex HMAC-SHA256 of the raw body.
	const linearBody = `{"action":"create","data":{"id":"2174add1-f7c8-44e3-bbf3-2d60b5ea8bc9","createdAt":"2020-01-23T12:53:18.084Z","updatedAt":"2020-01-23T12:53:18.084Z","archivedAt":null,"body":"Indeed, I think this is definitely an improvement over the previous version.","edited":false,"issueId":"539068e2-ae88-4d09-bd75-22eb4a59612f","userId":"aacdca22-6266-4c0a-ab3c-8fa70a26765c"},"type":"Comment","url":"https://linear.app/issue/LIN-1778/foo-bar#comment-77217de3-fb52-4dad-bb9a-b356beb93de8","createdAt":"2020-01-23T12:53:18.084Z","webhookTimestamp":1677611643000}`

	// Twitch: HMAC-SHA256 of message ID + timestamp + body, "sha256=" + hex
	// (https://dev.twitch.tv/docs/eventsub/handling-webhook-events/).
	const (
		twitchID   = "e76c6bd4-55c9-4987-8304-da1588d8988b"
		twitchTS   = "2019-11-16T10:11:12.634234626Z"
		twitchBody = `{"subscription":{"id":"f1c2a387-161a-49f9-a165-0f21d7a4e1c4","type":"channel.follow","version":"2","status":"enabled"},"event":{"user_id":"1337","broadcaster_user_id":"1337"}}`
	)

	// Square: the vector of square/square-python-sdk,
	// tests/utilities/test_webhooks_helper.py (signature key, notification
	// URL, body and x-square-hmacsha256-signature as published there).
	const (
		squareURL  = "https://webhook.site/679a4f3a-dcfa-49ee-bac5-9d0edad886b9"
		squareBody = `{"merchant_id":"MLEFBHHSJGVHD","type":"webhooks.test_notification","event_id":"ac3ac95b-f97d-458c-a6e6-18981597e05f","created_at":"2022-07-13T20:30:59.037339943Z","data":{"type":"webhooks","id":"bc368e64-01aa-407e-b46e-3231809b1129"}}`
	)

	// Zoom: "v0=" + hex HMAC-SHA256 of "v0:{x-zm-request-timestamp}:{body}"
	// (https://developers.zoom.us/docs/api/webhooks/#verify-webhook-events),
	// the timestamp in Unix seconds.
	const (
		zoomTS   = "1626230691"
		zoomBody = `{"event":"meeting.started","event_ts":1626230691572,"payload":{"account_id":"AAAAAABBBB","object":{"id":"1234567890","uuid":"czLF6FFXTfOmAAO6zR7bBg=="}}}`
	)

	// Intercom: "sha1=" + hex HMAC-SHA1 of the body, keyed with the app's
	// client secret.
	const intercomBody = `{"type":"notification_event","app_id":"ecahpwf5","data":{"type":"notification_event_data","item":{"type":"ping","message":"something something interop"}},"links":{},"id":"notif_123456-56465-546546","topic":"ping","delivery_status":"pending","delivery_attempts":1,"delivered_at":0,"first_sent_at":1392731331,"created_at":1392731331,"self":null}`

	// Lemon Squeezy: hex HMAC-SHA256 of the body in X-Signature
	// (https://docs.lemonsqueezy.com/help/webhooks/signing-requests).
	const lemonBody = `{"meta":{"event_name":"order_created","test_mode":true},"data":{"type":"orders","id":"1","attributes":{"store_id":1,"status":"paid"}}}`

	// Typeform: "sha256=" + base64 HMAC-SHA256 of the body
	// (https://www.typeform.com/developers/webhooks/secure-your-webhooks/).
	const typeformBody = `{"event_id":"01HQ0X0R8V6SQ8GPJ2VKWN0Y3S","event_type":"form_response","form_response":{"form_id":"lT4Z3j","token":"a3a12ec67a1365927098a606107fac15"}}`

	// Paddle Billing: hex HMAC-SHA256 of "{ts}:{body}" in
	// Paddle-Signature: ts=…;h1=…
	// (https://developer.paddle.com/webhooks/signature-verification).
	const (
		paddleTS   = "1671552777"
		paddleBody = `{"event_id":"evt_01gks14ge726w50ch2tmaw2a1x","event_type":"subscription.activated","occurred_at":"2023-02-27T12:32:48.142Z","notification_id":"ntf_01gt29v7nskhpcr2s59cmyykp3","data":{"id":"sub_01gt29v5xbanw6t4b4jc7zda8j"}}`
	)

	// Calendly: hex HMAC-SHA256 of "{t}.{body}" in
	// Calendly-Webhook-Signature: t=…,v1=…, keyed with the webhook signing
	// key.
	const (
		calendlyTS   = "1492774577"
		calendlyBody = `{"created_at":"2020-11-23T17:51:19.000000Z","created_by":"https://api.calendly.com/users/AAAAAAAAAAAAAAAA","event":"invitee.created","payload":{"uri":"https://api.calendly.com/scheduled_events/GBGBDCAADAEDCRZ2/invitees/AAAAAAAAAAAAAAAA"}}`
	)

	// Meta: "sha256=" + hex HMAC-SHA256 of the body in X-Hub-Signature-256,
	// keyed with the app secret
	// (https://developers.facebook.com/docs/graph-api/webhooks/getting-started);
	// a WhatsApp Cloud API message notification.
	const metaBody = `{"object":"whatsapp_business_account","entry":[{"id":"102290129340398","changes":[{"value":{"messaging_product":"whatsapp","metadata":{"display_phone_number":"15550783881","phone_number_id":"106540352242922"},"messages":[{"from":"16505551234","id":"wamid.HBgLMTY1MDM4Nzk0MzkVAgASGBQzQTRBNjU5OUFFRTAzODEwMTQ0RgA=","timestamp":"1749416383","type":"text","text":{"body":"Does it come in another color?"}}]},"field":"messages"}]}]}`

	// SendGrid: ECDSA P-256 over SHA-256 of timestamp + body, the vector
	// of sendgrid/sendgrid-go helpers/eventwebhook/eventwebhook_test.go
	// (its public key, signature, timestamp, and the payload it marshals).
	const (
		sendgridKey  = "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEEDr2LjtURuePQzplybdC+u4CwrqDqBaWjcMMsTbhdbcwHBcepxo7yAQGhHPTnlvFYPAZFceEu/1FwCM/QmGUhA=="
		sendgridSig  = "MEUCIQCtIHJeH93Y+qpYeWrySphQgpNGNr/U+UyUlBkU6n7RAwIgJTz2C+8a8xonZGi6BpSzoQsbVRamr2nlxFDWYNH2j/0="
		sendgridTS   = "1588788367"
		sendgridBody = `{"category":"example_payload","event":"test_event","message_id":"message_id"}`
	)

	return map[string]recipeDelivery{
		"sendgrid": {
			env: map[string]string{"SENDGRID_VERIFICATION_KEY": sendgridKey},
			now: 1588788400,
			headers: map[string]string{
				"X-Twilio-Email-Event-Webhook-Signature": sendgridSig,
				"X-Twilio-Email-Event-Webhook-Timestamp": sendgridTS,
			},
			body: sendgridBody,
			tampered: map[string]func(map[string]string, string) (map[string]string, string){
				"body":      changeBody,
				"timestamp": changeHeader("X-Twilio-Email-Event-Webhook-Timestamp", "1588788368"),
			},
		},
		"meta": {
			env:      map[string]string{"META_APP_SECRET": "meta-app-secret"},
			headers:  map[string]string{"X-Hub-Signature-256": "sha256=" + hex.EncodeToString(macOf(sha256.New, "meta-app-secret", metaBody))},
			body:     metaBody,
			tampered: map[string]func(map[string]string, string) (map[string]string, string){"body": changeBody},
		},
		"paddle": {
			env: map[string]string{"PADDLE_WEBHOOK_SECRET": "pdl_ntfset_01gkpjp8bkm3tm53kdgkx6sms7_6h3qd3uFSi9YCD3OLYAShQI90XTI5vEI"},
			now: 1671552780,
			headers: map[string]string{
				// A secret being rotated out signs the first h1.
				"Paddle-Signature": "ts=" + paddleTS + ";h1=" + hex.EncodeToString(macOf(sha256.New, "old", paddleTS+":"+paddleBody)) +
					";h1=" + hex.EncodeToString(macOf(sha256.New, "pdl_ntfset_01gkpjp8bkm3tm53kdgkx6sms7_6h3qd3uFSi9YCD3OLYAShQI90XTI5vEI", paddleTS+":"+paddleBody)),
			},
			body:    paddleBody,
			wantKey: "evt_01gks14ge726w50ch2tmaw2a1x",
			tampered: map[string]func(map[string]string, string) (map[string]string, string){
				"body":      changeBody,
				"timestamp": replaceInHeader("Paddle-Signature", "ts="+paddleTS, "ts=1671552778"),
			},
		},
		"calendly": {
			env: map[string]string{"CALENDLY_WEBHOOK_SIGNING_KEY": "calendly-signing-key"},
			now: 1492774600,
			headers: map[string]string{
				"Calendly-Webhook-Signature": "t=" + calendlyTS + ",v1=" + hex.EncodeToString(macOf(sha256.New, "calendly-signing-key", calendlyTS+"."+calendlyBody)),
			},
			body: calendlyBody,
			tampered: map[string]func(map[string]string, string) (map[string]string, string){
				"body":      changeBody,
				"timestamp": replaceInHeader("Calendly-Webhook-Signature", "t="+calendlyTS, "t=1492774578"),
			},
		},
		"linear": {
			env:      map[string]string{"LINEAR_WEBHOOK_SECRET": "SECRET"},
			headers:  map[string]string{"Linear-Signature": hex.EncodeToString(macOf(sha256.New, "SECRET", linearBody))},
			body:     linearBody,
			tampered: map[string]func(map[string]string, string) (map[string]string, string){"body": changeBody},
		},
		"twitch": {
			env: map[string]string{"TWITCH_EVENTSUB_SECRET": "s3cRe7-for-twitch"},
			now: 1573899080, // 8 s after twitchTS
			headers: map[string]string{
				"Twitch-Eventsub-Message-Id":        twitchID,
				"Twitch-Eventsub-Message-Timestamp": twitchTS,
				"Twitch-Eventsub-Message-Signature": "sha256=" + hex.EncodeToString(macOf(sha256.New, "s3cRe7-for-twitch", twitchID+twitchTS+twitchBody)),
			},
			body:    twitchBody,
			wantKey: twitchID,
			tampered: map[string]func(map[string]string, string) (map[string]string, string){
				"body":       changeBody,
				"message ID": changeHeader("Twitch-Eventsub-Message-Id", "e76c6bd4-55c9-4987-8304-da1588d8988c"),
				"timestamp":  changeHeader("Twitch-Eventsub-Message-Timestamp", "2019-11-16T10:11:13.634234626Z"),
				// The ID and timestamp are signed with nothing between:
				// moving a character across keeps the signed bytes.
				"ID and timestamp's boundary": func(h map[string]string, b string) (map[string]string, string) {
					h = maps.Clone(h)
					h["Twitch-Eventsub-Message-Id"] = twitchID + twitchTS[:1]
					h["Twitch-Eventsub-Message-Timestamp"] = twitchTS[1:]
					return h, b
				},
				"timestamp and ID's boundary": func(h map[string]string, b string) (map[string]string, string) {
					h = maps.Clone(h)
					h["Twitch-Eventsub-Message-Id"] = twitchID[:len(twitchID)-1]
					h["Twitch-Eventsub-Message-Timestamp"] = twitchID[len(twitchID)-1:] + twitchTS
					return h, b
				},
			},
		},
		"square": {
			env:     map[string]string{"SQUARE_SIGNATURE_KEY": "Ibxx_5AKakO-3qeNVR61Dw"},
			replace: [2]string{"https://example.com/webhooks/square", squareURL},
			headers: map[string]string{"X-Square-Hmacsha256-Signature": "GF4YkrJgGBDZ9NIYbNXBnMzqb2HoL4RW/S6vkZ9/2N4="},
			body:    squareBody,
			wantKey: "ac3ac95b-f97d-458c-a6e6-18981597e05f",
			tampered: map[string]func(map[string]string, string) (map[string]string, string){
				"body": changeBody,
				// The SDK test's other body: created_at a month earlier.
				"created_at": func(h map[string]string, body string) (map[string]string, string) {
					return h, strings.Replace(body, "2022-07-13", "2022-06-13", 1)
				},
			},
		},
		"zoom": {
			env: map[string]string{"ZOOM_WEBHOOK_SECRET_TOKEN": "zoom-secret-token"},
			now: 1626230700,
			headers: map[string]string{
				"X-Zm-Request-Timestamp": zoomTS,
				"X-Zm-Signature":         "v0=" + hex.EncodeToString(macOf(sha256.New, "zoom-secret-token", "v0:"+zoomTS+":"+zoomBody)),
			},
			body: zoomBody,
			tampered: map[string]func(map[string]string, string) (map[string]string, string){
				"body":      changeBody,
				"timestamp": changeHeader("X-Zm-Request-Timestamp", "1626230692"),
			},
		},
		"intercom": {
			env:      map[string]string{"INTERCOM_CLIENT_SECRET": "intercom-client-secret"},
			headers:  map[string]string{"X-Hub-Signature": "sha1=" + hex.EncodeToString(macOf(sha1.New, "intercom-client-secret", intercomBody))},
			body:     intercomBody,
			wantKey:  "notif_123456-56465-546546",
			tampered: map[string]func(map[string]string, string) (map[string]string, string){"body": changeBody},
		},
		"lemonsqueezy": {
			env:      map[string]string{"LEMONSQUEEZY_SIGNING_SECRET": "lemon-secret"},
			headers:  map[string]string{"X-Signature": hex.EncodeToString(macOf(sha256.New, "lemon-secret", lemonBody))},
			body:     lemonBody,
			tampered: map[string]func(map[string]string, string) (map[string]string, string){"body": changeBody},
		},
		"typeform": {
			env:      map[string]string{"TYPEFORM_WEBHOOK_SECRET": "typeform-secret"},
			headers:  map[string]string{"Typeform-Signature": "sha256=" + base64.StdEncoding.EncodeToString(macOf(sha256.New, "typeform-secret", typeformBody))},
			body:     typeformBody,
			wantKey:  "01HQ0X0R8V6SQ8GPJ2VKWN0Y3S",
			tampered: map[string]func(map[string]string, string) (map[string]string, string){"body": changeBody},
		},
	}
}

// TestReadmeRecipes loads each YAML snippet of the README's "Recipes for
// other providers" as written and checks that a delivery signed as the
// provider documents verifies and gives the key the README names, that a
// tampered one does not verify, and that validate finds nothing to say
// about the route (an unsigned key source would be warned about).
func TestReadmeRecipes(t *testing.T) {
	recipes := readmeRecipes(t)
	deliveries := recipeDeliveries()
	if got, want := slices.Sorted(maps.Keys(recipes)), slices.Sorted(maps.Keys(deliveries)); !slices.Equal(got, want) {
		t.Fatalf("README recipes: got %q, want %q (one test delivery per recipe)", got, want)
	}
	for _, name := range slices.Sorted(maps.Keys(recipes)) {
		d := deliveries[name]
		t.Run(name, func(t *testing.T) {
			text := "routes:\n" + recipes[name]
			if d.replace[0] != "" {
				if !strings.Contains(text, d.replace[0]) {
					t.Fatalf("recipe: got no %q to replace with the test vector's value", d.replace[0])
				}
				text = strings.ReplaceAll(text, d.replace[0], d.replace[1])
			}
			f, problems := loadText(t, text, d.env)
			if len(problems) > 0 {
				t.Fatalf("validate: got %q, want no problems", problems)
			}
			if ws := f.Warnings(); len(ws) > 0 {
				t.Errorf("warnings: got %v, want none", ws)
			}
			cfg := f.GatewayConfig().Routes[0].Provider
			cfg.Now = func() time.Time { return time.Unix(d.now, 0) }
			p, err := providers.New(cfg)
			if err != nil {
				t.Fatalf("providers.New: got %v, want nil", err)
			}
			if p.Verifier == nil {
				t.Fatal("verifier: got none, want the recipe's signature checked")
			}
			request := func(headers map[string]string, body string) *http.Request {
				r := httptest.NewRequest("POST", "/webhooks/"+name, strings.NewReader(body))
				for k, v := range headers {
					r.Header.Set(k, v)
				}
				return r
			}

			r := request(d.headers, d.body)
			if err := p.Verifier.Verify(r, []byte(d.body)); err != nil {
				t.Errorf("signed delivery: got %v, want it verified", err)
			}
			key, err := p.Key(r, []byte(d.body))
			switch {
			case err != nil:
				t.Errorf("key: got %v, want one", err)
			case d.wantKey != "" && key != d.wantKey:
				t.Errorf("key: got %q, want %q", key, d.wantKey)
			}
			for what, tamper := range d.tampered {
				h, b := tamper(d.headers, d.body)
				if err := p.Verifier.Verify(request(h, b), []byte(b)); !errors.Is(err, providers.ErrBadSignature) {
					t.Errorf("delivery with its %s changed: got %v, want %v", what, err, providers.ErrBadSignature)
				}
			}
		})
	}
}

// TestRecipesCheckTimestamps checks that the recipes that sign a timestamp
// (Zoom's and SendGrid's headers, Paddle's and Calendly's signature items
// in Unix seconds, Twitch's header in RFC 3339) refuse a correctly signed
// delivery older than their tolerance.
func TestRecipesCheckTimestamps(t *testing.T) {
	recipes := readmeRecipes(t)
	for _, name := range []string{"zoom", "paddle", "calendly", "sendgrid", "twitch"} {
		t.Run(name, func(t *testing.T) {
			d := recipeDeliveries()[name]
			f, problems := loadText(t, "routes:\n"+recipes[name], d.env)
			if len(problems) > 0 {
				t.Fatalf("validate: got %q, want no problems", problems)
			}
			cfg := f.GatewayConfig().Routes[0].Provider
			// Past every recipe's tolerance: the default, and Twitch's 10m.
			cfg.Now = func() time.Time { return time.Unix(d.now+int64(11*time.Minute/time.Second), 0) }
			p, err := providers.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			r := httptest.NewRequest("POST", "/webhooks/"+name, strings.NewReader(d.body))
			for k, v := range d.headers {
				r.Header.Set(k, v)
			}
			if err := p.Verifier.Verify(r, []byte(d.body)); !errors.Is(err, providers.ErrStale) {
				t.Errorf("delivery past the tolerance: got %v, want %v", err, providers.ErrStale)
			}
		})
	}
}

// TestMetaRecipePassesTheSubscriptionCheck serves the README's Meta recipe
// in front of an application that answers Meta's subscription check: the
// unsigned GET ?hub.challenge=… reaches it and its answer comes back, a
// signed notification is forwarded once, and neither an unsigned one nor
// a GET with a body gets through.
func TestMetaRecipePassesTheSubscriptionCheck(t *testing.T) {
	var posts atomic.Int32
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			q := r.URL.Query()
			if q.Get("hub.mode") != "subscribe" || q.Get("hub.verify_token") != "meatyhamhock" {
				http.Error(w, "wrong verify token", http.StatusForbidden)
				return
			}
			io.WriteString(w, q.Get("hub.challenge"))
			return
		}
		posts.Add(1)
	}))
	t.Cleanup(app.Close)

	d := recipeDeliveries()["meta"]
	text := strings.Replace("routes:\n"+readmeRecipes(t)["meta"], "http://127.0.0.1:3000", app.URL, 1)
	f, problems := loadText(t, text, d.env)
	if len(problems) > 0 {
		t.Fatalf("validate: got %q, want no problems", problems)
	}
	store := memstore.New(memstore.Options{})
	t.Cleanup(func() { store.Close() })
	gw, err := proxy.New(f.GatewayConfig(), store, proxy.Options{})
	if err != nil {
		t.Fatalf("proxy.New: %v", err)
	}
	t.Cleanup(func() { gw.Close() })
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)

	send := func(method, query, body string, headers map[string]string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+"/webhooks/meta"+query, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	tests := []struct {
		name, method, query, body string
		headers                   map[string]string
		wantStatus                int
		wantBody                  string
	}{
		{"subscription check", "GET", "?hub.mode=subscribe&hub.challenge=1158201444&hub.verify_token=meatyhamhock", "", nil, 200, "1158201444"},
		{"subscription check, wrong token: the application's answer", "GET", "?hub.mode=subscribe&hub.challenge=1158201444&hub.verify_token=guess", "", nil, 403, ""},
		{"signed notification", "POST", "", d.body, d.headers, 200, ""},
		{"its retry", "POST", "", d.body, d.headers, 200, `"status":"duplicate"`},
		{"unsigned notification", "POST", "", d.body, nil, 401, ""},
		{"a GET with a body", "GET", "", d.body, d.headers, 405, ""},
		{"signed, another method", "PUT", "", d.body, d.headers, 405, ""},
	}
	for _, tt := range tests {
		status, body := send(tt.method, tt.query, tt.body, tt.headers)
		if status != tt.wantStatus {
			t.Errorf("%s: got status %d, want %d (body %s)", tt.name, status, tt.wantStatus, body)
		}
		if tt.wantBody != "" && !strings.Contains(body, tt.wantBody) {
			t.Errorf("%s: got body %q, want it to contain %q", tt.name, body, tt.wantBody)
		}
	}
	if got := posts.Load(); got != 1 {
		t.Errorf("notifications the application got: %d, want 1", got)
	}
}
