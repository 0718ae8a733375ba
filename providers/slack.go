package providers

import (
	"crypto/hmac"
	"crypto/sha256"
	"fmt"
	"net/http"
)

// Slack's headers.
const (
	slackSignatureHeader = "X-Slack-Signature"
	slackTimestampHeader = "X-Slack-Request-Timestamp"
)

// slackVerifier checks X-Slack-Signature: v0=<hex HMAC-SHA256 of
// "v0:{X-Slack-Request-Timestamp}:{raw body}">, keyed with the app's signing
// secret, and the timestamp against the tolerance.
type slackVerifier struct {
	secrets [][]byte
	clock   clock
}

var _ Verifier = (*slackVerifier)(nil)

// Verify implements Verifier.
func (v *slackVerifier) Verify(r *http.Request, body []byte) error {
	got, err := hexSHA256Header(r, slackSignatureHeader, "v0=")
	if err != nil {
		return err
	}
	tsText, err := signedHeader(r, slackTimestampHeader)
	if err != nil {
		return err
	}
	ts, ok := parseUnix(tsText)
	if !ok {
		return fmt.Errorf("%w: missing or malformed %s header", ErrBadSignature, slackTimestampHeader)
	}
	for _, key := range v.secrets {
		want := macOf(sha256.New, key, []byte("v0:"), []byte(tsText), []byte(":"), body)
		if hmac.Equal(got, want) {
			return v.clock.check(ts)
		}
	}
	return fmt.Errorf("%w: %s does not match", ErrBadSignature, slackSignatureHeader)
}
