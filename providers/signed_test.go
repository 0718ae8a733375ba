package providers

import (
	"slices"
	"strings"
	"testing"
)

func TestUnsignedKeySources(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want []string
	}{
		{"no secrets", Config{Provider: Generic, Keys: []string{"query:id"}}, nil},
		{"preset", Config{Provider: GitHub, Secrets: []string{"s"}}, nil},
		{"preset written out", Config{Provider: GitHub, Secrets: []string{"s"}, Keys: PresetKeys(GitHub)}, nil},
		{"stripe body sources", Config{Provider: Stripe, Secrets: []string{"s"}, Keys: []string{"json:id", "body"}}, nil},
		{"stripe header", Config{Provider: Stripe, Secrets: []string{"s"}, Keys: []string{"header:Idempotency-Key", "json:id"}}, []string{"header:Idempotency-Key"}},
		{"github query", Config{Provider: GitHub, Secrets: []string{"s"}, Keys: []string{"query:id", "body"}}, []string{"query:id"}},
		{"standard webhooks ids", Config{Provider: StandardWebhooks, Secrets: []string{"whsec_c2VjcmV0"}, Keys: []string{"header:Webhook-Id", "header:svix-id", "header:X-Other"}}, []string{"header:X-Other"}},
		{"generic default template", Config{Provider: Generic, Secrets: []string{"s"}, Keys: []string{"header:Idempotency-Key", "json:data.object.id", "body"}}, []string{"header:Idempotency-Key"}},
		{"generic signed header", Config{Provider: Generic, Secrets: []string{"s"}, Keys: []string{"header:x-event-id", "body"},
			Signature: GenericSignature{Template: "{header:X-Event-Id}.{body}"}}, nil},
		{"generic timestamp header", Config{Provider: Generic, Secrets: []string{"s"}, Keys: []string{"header:X-Timestamp"},
			Signature: GenericSignature{TimestampHeader: "X-Timestamp", Template: "{timestamp}.{body}"}}, nil},
		{"generic body unsigned", Config{Provider: Generic, Secrets: []string{"s"}, Keys: []string{"json:id", "header:X-Id"},
			Signature: GenericSignature{Template: "{header:X-Id}"}}, []string{"json:id"}},
		{"generic query", Config{Provider: Generic, Secrets: []string{"s"}, Keys: []string{"query:id", "json:id"}}, []string{"query:id"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := UnsignedKeySources(tt.cfg); !slices.Equal(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

// TestShiftableKeySources: a key source signed next to another value of
// any form, with nothing between them, is named; a literal or a timestamp
// between them makes it safe.
func TestShiftableKeySources(t *testing.T) {
	gen := func(tmpl string, keys ...string) Config {
		sig := GenericSignature{Template: tmpl}
		if strings.Contains(tmpl, "{timestamp}") || strings.Contains(tmpl, "X-Ts") {
			sig.TimestampHeader = "X-Ts"
		}
		return Config{Provider: Generic, Secrets: []string{"s"}, Keys: keys, Signature: sig}
	}
	tests := []struct {
		name string
		cfg  Config
		want []string
	}{
		{"two headers adjacent", gen("{header:X-Id}{header:X-Ev}{body}", "header:x-id"), []string{"header:x-id"}},
		{"a header then the body", gen("{header:X-Id}{body}", "header:X-Id", "json:id"), []string{"header:X-Id"}},
		{"the body key after a header", gen("{timestamp}.{header:X-Ev}{body}", "body"), []string{"body"}},
		{"a literal between them", gen("{header:X-Id}.{header:X-Ev}.{body}", "header:X-Id", "body"), nil},
		{"a timestamp between them", gen("{header:X-Id}{timestamp}{body}", "header:X-Id", "body"), nil},
		{"the timestamp header as a header", gen("{header:X-Id}{header:X-Ts}{body}", "header:X-Id"), nil},
		{"not a key source", gen("{header:X-Id}{header:X-Ev}.{body}", "json:id"), nil},
		{"no secrets", Config{Provider: Generic, Keys: []string{"header:X-Id"}, Signature: GenericSignature{Template: "{header:X-Id}{body}"}}, nil},
		{"a preset", Config{Provider: Stripe, Secrets: []string{"s"}, Keys: []string{"json:id"}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ShiftableKeySources(tt.cfg); !slices.Equal(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}
