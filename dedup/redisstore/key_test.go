package redisstore

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/dedupgw/dedupgw/dedup"
)

func TestRedisKey(t *testing.T) {
	hash := func(s string) string {
		sum := sha256.Sum256([]byte(s))
		return "#" + hex.EncodeToString(sum[:])
	}
	tests := []struct {
		name string
		key  dedup.Key
		want string
	}{
		{"stripe id", dedup.Key{Namespace: "stripe", ID: "evt_1NG8Du2eZvKYlo2C"}, "p:stripe:evt_1NG8Du2eZvKYlo2C"},
		{"colons in id kept", dedup.Key{Namespace: "gh", ID: "a:b:c"}, "p:gh:a:b:c"},
		{"200 bytes kept", dedup.Key{Namespace: "n", ID: strings.Repeat("x", 200)}, "p:n:" + strings.Repeat("x", 200)},
		{"201 bytes hashed", dedup.Key{Namespace: "n", ID: strings.Repeat("x", 201)}, "p:n:" + hash(strings.Repeat("x", 201))},
		{"space hashed", dedup.Key{Namespace: "n", ID: "a b"}, "p:n:" + hash("a b")},
		{"control hashed", dedup.Key{Namespace: "n", ID: "a\nb"}, "p:n:" + hash("a\nb")},
		{"DEL hashed", dedup.Key{Namespace: "n", ID: "a\x7f"}, "p:n:" + hash("a\x7f")},
		{"non-ASCII hashed", dedup.Key{Namespace: "n", ID: "日本"}, "p:n:" + hash("日本")},
		{"empty hashed", dedup.Key{Namespace: "n", ID: ""}, "p:n:" + hash("")},
		{"leading mark hashed", dedup.Key{Namespace: "n", ID: "#abc"}, "p:n:" + hash("#abc")},
		{"colon in namespace hashed", dedup.Key{Namespace: "a:b", ID: "c"}, "p:" + hash("a:b") + ":c"},
		{"empty namespace hashed", dedup.Key{Namespace: "", ID: "c"}, "p:" + hash("") + ":c"},
		{"printable punctuation kept", dedup.Key{Namespace: "n", ID: `!"}~`}, `p:n:!"}~`},
		{"Cluster hash tag hashed", dedup.Key{Namespace: "n", ID: "{z}evt_1"}, "p:n:" + hash("{z}evt_1")},
		{"brace in namespace hashed", dedup.Key{Namespace: "{n}", ID: "c"}, "p:" + hash("{n}") + ":c"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := redisKey("p:", tt.key); got != tt.want {
				t.Errorf("redisKey(%q): got %q, want %q", tt.key, got, tt.want)
			}
		})
	}
}

func TestRedisKeyInjective(t *testing.T) {
	// Pairs that a naive "ns:id" join would confuse.
	pairs := [][2]dedup.Key{
		{{Namespace: "a:b", ID: "c"}, {Namespace: "a", ID: "b:c"}},
		{{Namespace: "n", ID: "#" + strings.Repeat("0", 64)}, {Namespace: "n", ID: strings.Repeat("0", 64)}},
		{{Namespace: "n", ID: "x y"}, {Namespace: "n", ID: hashPart("x y")}},
	}
	for _, p := range pairs {
		if a, b := redisKey("", p[0]), redisKey("", p[1]); a == b {
			t.Errorf("redisKey(%q) and redisKey(%q): got the same key %q, want different keys", p[0], p[1], a)
		}
	}
}

func hashPart(s string) string { return part(s, false) }
