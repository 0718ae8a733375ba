package chaos

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Server timeouts the hostile tests configure, and how long past them a cut
// may take. serverTimeoutsConfig is the YAML that sets them.
const (
	hostileHeaderTimeout = time.Second
	hostileBodyTimeout   = 2 * time.Second
	cutSlack             = 3 * time.Second
	// cutBound is how long a test waits for a cut before it fails: generous,
	// so a gateway with long built-in timeouts is reported, not hung on.
	cutBound = 20 * time.Second
)

var serverTimeoutsConfig = ""

// hostileGateway starts one bolt replica with two routes in front of an App
// that never fails: /webhooks/stripe (key json:id) and /webhooks/body (key:
// SHA-256 of the canonicalised body).
func hostileGateway(t *testing.T) (*Gateway, *App) {
	t.Helper()
	bin := gatewayBinary(t)
	dir := t.TempDir()
	app := NewApp(AppConfig{})
	t.Cleanup(app.Close)
	g, err := NewGateway(bin, dir, "h0", func(addr, admin string) string {
		return fmt.Sprintf(`listen: %q
admin:
  listen: %q
log:
  level: info
  format: json
store:
  backend: bolt
  bolt:
    path: %q
%sdefaults:
  lease: 2s
  upstream_timeout: 1s
routes:
  - name: stripe
    path: /webhooks/stripe
    upstream: %q
    provider: stripe
  - name: body
    path: /webhooks/body
    upstream: %q
    provider: generic
    keys: ["body"]
`, addr, admin, filepath.Join(dir, "h.db"), serverTimeoutsConfig, app.URL(), app.URL())
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := g.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return g, app
}

// assertHealthy checks the replica survived: still running, /healthz 200, and
// no panic or race in its output.
func assertHealthy(t *testing.T, g *Gateway) {
	t.Helper()
	for _, u := range g.Unexpected() {
		t.Errorf("gateway crashed: %s", u)
	}
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(g.AdminURL() + "/healthz")
	if err != nil {
		t.Errorf("GET /healthz after the attack: %v", err)
		return
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("got /healthz %d after the attack, want 200", resp.StatusCode)
	}
	gl, err := ReadLogFile(g.Name, g.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range gl.Trouble {
		t.Errorf("gateway output: %s", tr)
	}
}

// dribble writes prefix, then payload one byte every interval, until the
// server cuts the connection or bound passes. It returns how long the server
// took to cut it (from the first byte), and what the server answered if it
// answered.
func dribble(t *testing.T, addr string, prefix, payload []byte, interval time.Duration) (time.Duration, string, bool) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	if _, err := c.Write(prefix); err != nil {
		t.Fatal(err)
	}
	// The reader sees the server's answer or its close.
	answered := make(chan string, 1)
	go func() {
		_ = c.SetReadDeadline(start.Add(cutBound))
		line, _ := bufio.NewReader(c).ReadString('\n')
		answered <- strings.TrimSpace(line)
	}()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case ans := <-answered:
			return time.Since(start), ans, true
		case <-tick.C:
		}
		if time.Since(start) > cutBound {
			_ = c.Close()
			<-answered
			return time.Since(start), "", false
		}
		if _, err := c.Write(payload[i%len(payload) : i%len(payload)+1]); err != nil {
			// Cut while writing: wait for the reader to see it too.
			ans := <-answered
			return time.Since(start), ans, true
		}
	}
}

func TestSlowSendersAreCutOff(t *testing.T) {
	leakCheck(t)
	g, app := hostileGateway(t)
	tests := []struct {
		name    string
		prefix  string
		payload string
		within  time.Duration
	}{
		{
			name:    "slowloris: headers dribbled",
			prefix:  "POST /webhooks/stripe HTTP/1.1\r\nHost: gw\r\n",
			payload: "X-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n",
			within:  hostileHeaderTimeout + cutSlack,
		},
		{
			name:    "slow body: body dribbled after complete headers",
			prefix:  "POST /webhooks/stripe HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n",
			payload: `{"id":"evt_slow_body","pad":"` + strings.Repeat("x", 200) + `"}`,
			within:  hostileBodyTimeout + cutSlack,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			took, ans, cut := dribble(t, g.Addr, []byte(tt.prefix), []byte(tt.payload), 100*time.Millisecond)
			t.Logf("cut after %s, answer %q", took.Round(time.Millisecond), ans)
			if !cut {
				t.Fatalf("connection still open after %s of dribbling, want it cut within %s", took.Round(time.Millisecond), tt.within)
			}
			if took > tt.within {
				t.Errorf("got the connection cut after %s, want within %s", took.Round(time.Millisecond), tt.within)
			}
			if ans != "" && !strings.HasPrefix(ans, "HTTP/1.1 4") {
				t.Errorf("got answer %q, want a 4xx or a plain close", ans)
			}
		})
	}
	if got := app.Stats().Requests; got != 0 {
		t.Errorf("got %d requests at the upstream, want 0: a cut delivery must not be forwarded", got)
	}
	assertHealthy(t, g)
}

func TestDeepJSONIsBounded(t *testing.T) {
	leakCheck(t)
	g, _ := hostileGateway(t)
	c := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	nest := func(open, close string, n int, inner string) []byte {
		var b bytes.Buffer
		b.WriteString(strings.Repeat(open, n))
		b.WriteString(inner)
		b.WriteString(strings.Repeat(close, n))
		return b.Bytes()
	}
	tests := []struct {
		name string
		body []byte
	}{
		{"arrays 10,000 deep", nest("[", "]", 10_000, "1")},
		{"objects 10,000 deep", nest(`{"a":`, "}", 10_000, "1")},
		{"id beside objects 10,000 deep", append([]byte(`{"id":"evt_deep","x":`), append(nest(`{"a":`, "}", 10_000, "1"), '}')...)},
		{"arrays 500,000 deep (just under 1 MiB)", nest("[", "]", 500_000, "")},
		{"unclosed arrays 1,000,000 deep", []byte(strings.Repeat("[", 1_000_000))},
	}
	for _, route := range []string{"stripe", "body"} {
		for _, tt := range tests {
			t.Run(route+"/"+tt.name, func(t *testing.T) {
				start := time.Now()
				resp, err := c.Post(g.URL()+"/webhooks/"+route, "application/json", bytes.NewReader(tt.body))
				if err != nil {
					t.Fatalf("POST a deep body: %v (the gateway must answer, not drop the connection)", err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				took := time.Since(start)
				t.Logf("status %d, Dedup-Status %q, %s", resp.StatusCode, resp.Header.Get("Dedup-Status"), took.Round(time.Millisecond))
				if resp.StatusCode >= 500 {
					t.Errorf("got status %d, want a bounded answer below 500 (treated as non-JSON, or rejected)", resp.StatusCode)
				}
				if took > 5*time.Second {
					t.Errorf("got an answer after %s, want one within 5s", took)
				}
			})
		}
	}
	assertHealthy(t, g)
}
