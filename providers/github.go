package providers

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
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
	h := r.Header.Get(githubSignatureHeader)
	if h == "" {
		return fmt.Errorf("%w: missing %s header", ErrNoSignature, githubSignatureHeader)
	}
	hexSig, ok := strings.CutPrefix(h, "sha256=")
	if !ok {
		return fmt.Errorf("%w: %s header lacks the sha256= prefix", ErrBadSignature, githubSignatureHeader)
	}
	got, err := hex.DecodeString(hexSig)
	if err != nil || len(got) != sha256.Size {
		return fmt.Errorf("%w: %s header is not a hex SHA-256 HMAC", ErrBadSignature, githubSignatureHeader)
	}
	for _, key := range v.secrets {
		if hmac.Equal(got, macOf(sha256.New, key, body)) {
			return nil
		}
	}
	return fmt.Errorf("%w: %s does not match", ErrBadSignature, githubSignatureHeader)
}
