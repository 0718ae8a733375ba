package chaos

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Server timeouts for the slow-sender tests. The suite asks for short ones in
// a server: block (serverTimeoutsYAML) when the gateway's config accepts it;
// otherwise it expects the built-in ones from cmd/dedupgw/serve.go
// (ReadHeaderTimeout 10s; ReadTimeout max(30s, 10s + max_body_bytes at
// 64 KiB/s) = 30s for the default 1 MiB).
const (
	serverTimeoutsYAML = "server:\n  read_header_timeout: 1s\n  read_timeout: 2s\n"
	shortHeaderTimeout = time.Second
	shortBodyTimeout   = 2 * time.Second
	builtinHeaderTime  = 10 * time.Second
	builtinBodyTime    = 30 * time.Second
	// cutSlack is how long past its timeout a cut may take.
	cutSlack = 3 * time.Second
)

// serverTimeouts reports the server: block to configure and the header and
// body timeouts to expect, probing the binary with `dedupgw validate`.
func serverTimeouts(t *testing.T, bin string) (yaml string, header, body time.Duration) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "probe.yaml")
	cfg := serverTimeoutsYAML + "routes:\n  - name: stripe\n    path: /webhooks/stripe\n    upstream: \"http://127.0.0.1:1\"\n    provider: stripe\n"
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "validate", "--config", p).CombinedOutput()
	if err != nil {
		t.Logf("the gateway has no configurable server timeouts (%s); expecting the built-in %s header and %s body timeouts",
			strings.TrimSpace(string(out)), builtinHeaderTime, builtinBodyTime)
		return "", builtinHeaderTime, builtinBodyTime
	}
	return serverTimeoutsYAML, shortHeaderTimeout, shortBodyTimeout
}

// hostileGateway starts one bolt replica with two routes in front of an App
// that never fails: /webhooks/stripe (key json:id) and /webhooks/body (key:
// SHA-256 of the canonicalised body).
func hostileGateway(t *testing.T, serverYAML string) (*Gateway, *App) {
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
`, addr, admin, filepath.Join(dir, "h.db"), serverYAML, app.URL(), app.URL())
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
func dribble(t *testing.T, addr string, prefix, payload []byte, interval, cutBound time.Duration) (time.Duration, string, bool) {
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

// TestHostileInput sends hostile deliveries to one real replica, in parallel
// so the slow ones overlap: slow senders, JSON depth bombs, hostile event IDs.
// The replica must survive all of them.
func TestHostileInput(t *testing.T) {
	leakCheck(t)
	yaml, headerTimeout, bodyTimeout := serverTimeouts(t, gatewayBinary(t))
	g, app := hostileGateway(t, yaml)
	// The group returns when every parallel subtest has ended.
	t.Run("group", func(t *testing.T) {
		t.Run("slow senders", func(t *testing.T) {
			t.Parallel()
			testSlowSenders(t, g, app, headerTimeout, bodyTimeout)
		})
		t.Run("deep JSON", func(t *testing.T) {
			t.Parallel()
			testDeepJSON(t, g)
		})
		t.Run("event IDs", func(t *testing.T) {
			t.Parallel()
			testHostileKeys(t, g, app)
		})
	})
	assertHealthy(t, g)
	// A key is attacker-chosen: logging it whole lets one delivery write
	// tens of KiB into every log line about it.
	t.Run("log lines bound the key", func(t *testing.T) {
		gl, err := ReadLogFile(g.Name, g.LogPath)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range gl.Lines {
			if len(l.Key) > maxLoggedKey {
				t.Fatalf("got a log line (%q) carrying a %d-byte key, want at most %d bytes (truncate, or log a hash of long keys)", l.Msg, len(l.Key), maxLoggedKey)
			}
		}
	})
}

// maxLoggedKey is the longest key a log line may carry.
const maxLoggedKey = 1024

// testSlowSenders dribbles headers (slowloris) and a body; the replica must
// cut both within its timeouts and forward neither.
func testSlowSenders(t *testing.T, g *Gateway, app *App, headerTimeout, bodyTimeout time.Duration) {
	const slowID = "evt_slow_body"
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
			within:  headerTimeout + cutSlack,
		},
		{
			name:    "slow body: body dribbled after complete headers",
			prefix:  "POST /webhooks/stripe HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n",
			payload: `{"id":"` + slowID + `","pad":"` + strings.Repeat("x", 200) + `"}`,
			within:  bodyTimeout + cutSlack,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.within > 15*time.Second && !fullMode() {
				t.Skipf("the cut is expected only after %s; short mode skips it (DEDUPGW_CHAOS=full runs it, or give the gateway a server.read_timeout key)", tt.within)
			}
			t.Parallel()
			took, ans, cut := dribble(t, g.Addr, []byte(tt.prefix), []byte(tt.payload), 100*time.Millisecond, tt.within+5*time.Second)
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
			if got := len(app.Processed()[slowID]); got != 0 {
				t.Errorf("got the slow body processed %d times upstream, want 0: a cut delivery must not be forwarded", got)
			}
		})
	}
}

// testDeepJSON posts JSON nested up to a million deep to a json:id route and
// a body-hash route: a bounded answer below 500 each time.
func testDeepJSON(t *testing.T, g *Gateway) {
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
}
