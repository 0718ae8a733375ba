package redisstore

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/dedupgw/dedupgw/dedup"
)

// maxLiteralID is the longest ID stored as it is.
const maxLiteralID = 200

// hashedMark starts a key part stored by its SHA-256. No literal part starts
// with it, so literal and hashed parts never collide.
const hashedMark = '#'

// redisKey returns the Redis key of k:
//
//	prefix + namespace + ":" + id
//
// The ID is kept as it is when it is 1 to 200 bytes of printable ASCII other
// than space (0x21-0x7E), without '{' and not starting with '#'; otherwise it
// is stored as "#" + the hex SHA-256 of the ID. The namespace follows the same
// rule and must also not contain ':' to be kept. A '{' would let a sender
// choose a Cluster hash tag ("{z}evt_1") and pile every key it makes onto
// one slot, one shard. So an operator can type every literal
// key (redis-cli GET dedupgw:stripe:evt_1), and the mapping is one to one: the
// first ':' after the prefix always ends the namespace.
func redisKey(prefix string, k dedup.Key) string {
	ns := part(k.Namespace, true)
	id := part(k.ID, false)
	var b strings.Builder
	b.Grow(len(prefix) + len(ns) + 1 + len(id))
	b.WriteString(prefix)
	b.WriteString(ns)
	b.WriteByte(':')
	b.WriteString(id)
	return b.String()
}

// part returns s, or '#' + hex SHA-256 of s when s is not safe to keep.
func part(s string, namespace bool) string {
	if isLiteral(s, namespace) {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	return string(hashedMark) + hex.EncodeToString(sum[:])
}

// isLiteral reports whether s is stored as it is.
func isLiteral(s string, namespace bool) bool {
	if len(s) == 0 || len(s) > maxLiteralID || s[0] == hashedMark {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x21 || c > 0x7e || c == '{' || (namespace && c == ':') {
			return false
		}
	}
	return true
}
