package chaos

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// testHostileKeys sends events whose IDs are
// valid JSON strings but hostile as header values or store keys. Each must
// reach the upstream exactly once: a first delivery forwarded with a 2xx, a
// second answered as a duplicate. An ID that can never be forwarded is an
// event lost (the provider retries it forever); one that is not deduplicated
// is a duplicate forwarded outside the documented limits.
func testHostileKeys(t *testing.T, g *Gateway, app *App) {
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	tests := []struct {
		name string
		id   string
	}{
		{"plain", "evt_plain"},
		{"control characters", "evt_ctl\u0000\r\n\u0007x"},
		{"newline only", "evt_nl\nX-Injected: 1"},
		{"non-ASCII", "evt_ünïcødé_日本"},
		{"255 bytes", "evt_" + strings.Repeat("a", 251)},
		{"4 KiB", "evt_" + strings.Repeat("b", 4<<10)},
		// bbolt's MaxKeySize is 32768: a backend must hash longer keys.
		{"40 KiB (beyond bbolt's key limit)", "evt_" + strings.Repeat("c", 40<<10)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body, err := json.Marshal(map[string]string{"id": tt.id, "object": "event"})
			if err != nil {
				t.Fatal(err)
			}
			want := []struct {
				status      int
				dedupStatus string
			}{{200, "forwarded"}, {200, "duplicate"}}
			for i, w := range want {
				resp, err := c.Post(g.URL()+"/webhooks/stripe", "application/json", bytes.NewReader(body))
				if err != nil {
					t.Fatalf("delivery %d: %v", i+1, err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				got := resp.Header.Get("Dedup-Status")
				if resp.StatusCode != w.status || got != w.dedupStatus {
					t.Errorf("delivery %d: got %d %q, want %d %q", i+1, resp.StatusCode, got, w.status, w.dedupStatus)
				}
			}
			if got := len(app.Processed()[tt.id]); got != 1 {
				t.Errorf("got the event processed %d times by the upstream, want 1", got)
			}
		})
	}
}
