package providers

import (
	"crypto/hmac"
	"crypto/sha256"
	"fmt"
	"net/http"
)

// GitHub's headers.
const (
	githubSignatureHeader = "X-Hub-Signature-256"
	githubDeliveryHeader  = "X-GitHub-Delivery"
)

// githubVerifier checks X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the raw
// body>. The legacy SHA-1 X-Hub-Signature header is not accepted. GitHub signs
// no timestamp and not the X-GitHub-Delivery header.
type githubVerifier struct {
	secrets [][]byte
}

var _ Verifier = (*githubVerifier)(nil)

// Verify implements Verifier.
func (v *githubVerifier) Verify(r *http.Request, body []byte) error {
	got, err := hexSHA256Header(r, githubSignatureHeader, "sha256=")
	if err != nil {
		return err
	}
	for _, key := range v.secrets {
		if hmac.Equal(got, macOf(sha256.New, key, body)) {
			return nil
		}
	}
	return fmt.Errorf("%w: %s does not match", ErrBadSignature, githubSignatureHeader)
}
