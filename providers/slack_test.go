package providers

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"testing"
	"time"
)

// Slack's documented example ("Verifying requests from Slack"), also used by
// target/goalert's notification/slack/signature_test.go.
const (
	slackDocSecret = "8f742231b10e8888abcd99yyyzzz85a5"
	slackDocTS     = 1531420618
	slackDocBody   = "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c"
	slackDocSig    = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"
)

// slackSign signs body the way Slack does.
func slackSign(secret string, ts int64, body string) string {
	m := hmac.New(sha256.New, []byte(secret))
	fmt.Fprintf(m, "v0:%d:%s", ts, body)
	return "v0=" + hex.EncodeToString(m.Sum(nil))
}

func TestSlackVerify(t *testing.T) {
	ts := fmt.Sprint(slackDocTS)
	tests := []struct {
		name    string
		secrets []string
		now     int64
		sig     string // "-" means absent
		ts      string // "-" means absent
		body    string
		want    error
	}{
		{"docs example", []string{slackDocSecret}, slackDocTS + 10, slackDocSig, ts, slackDocBody, nil},
		{"rotation", []string{"old", slackDocSecret}, slackDocTS, slackDocSig, ts, slackDocBody, nil},
		{"stale", []string{slackDocSecret}, slackDocTS + 301, slackDocSig, ts, slackDocBody, ErrStale},
		{"future", []string{slackDocSecret}, slackDocTS - 301, slackDocSig, ts, slackDocBody, ErrStale},
		{"wrong secret", []string{"nope"}, slackDocTS, slackDocSig, ts, slackDocBody, ErrBadSignature},
		{"tampered body", []string{slackDocSecret}, slackDocTS, slackDocSig, ts, slackDocBody + "&x=1", ErrBadSignature},
		{"timestamp changed", []string{slackDocSecret}, slackDocTS, slackDocSig, "1531420619", slackDocBody, ErrBadSignature},
		{"missing signature", []string{slackDocSecret}, slackDocTS, "-", ts, slackDocBody, ErrNoSignature},
		{"missing timestamp", []string{slackDocSecret}, slackDocTS, slackDocSig, "-", slackDocBody, ErrBadSignature},
		{"malformed timestamp", []string{slackDocSecret}, slackDocTS, slackDocSig, "15314206a8", slackDocBody, ErrBadSignature},
		{"v1 prefix", []string{slackDocSecret}, slackDocTS, "v1=" + slackDocSig[3:], ts, slackDocBody, ErrBadSignature},
		{"bad hex", []string{slackDocSecret}, slackDocTS, "v0=zz", ts, slackDocBody, ErrBadSignature},
		{"fresh signature", []string{"k"}, 2000, slackSign("k", 2000, "{}"), "2000", "{}", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := New(Config{Provider: Slack, Secrets: tt.secrets, Now: fixedClock(tt.now)})
			if err != nil {
				t.Fatalf("New: got %v, want nil", err)
			}
			h := map[string]string{}
			if tt.sig != "-" {
				h["X-Slack-Signature"] = tt.sig
			}
			if tt.ts != "-" {
				h["X-Slack-Request-Timestamp"] = tt.ts
			}
			err = p.Verifier.Verify(newRequest(h), []byte(tt.body))
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Errorf("Verify: got %v, want %v", err, tt.want)
			}
		})
	}
}

// FuzzSlackSignature checks the X-Slack-Signature and timestamp parsing never
// panics and only ever returns a sentinel.
func FuzzSlackSignature(f *testing.F) {
	f.Add(slackDocSig, "1531420618")
	f.Add("v0=", "")
	f.Add("v0=00", "99999999999999999999")
	v := &slackVerifier{secrets: [][]byte{[]byte(slackDocSecret)}, clock: clock{now: fixedClock(slackDocTS), tolerance: 5 * time.Minute}}
	f.Fuzz(func(t *testing.T, sig, ts string) {
		r := newRequest(map[string]string{"X-Slack-Signature": sig, "X-Slack-Request-Timestamp": ts})
		err := v.Verify(r, []byte(slackDocBody))
		if err != nil && !errors.Is(err, ErrNoSignature) && !errors.Is(err, ErrBadSignature) && !errors.Is(err, ErrStale) {
			t.Fatalf("Verify(%q, %q): got %v, want a sentinel", sig, ts, err)
		}
	})
}
