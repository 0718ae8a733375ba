package chaos

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

func TestLostPortRace(t *testing.T) {
	exited := fmt.Errorf("r0 %w (see log)", errExitedAtStart)
	tests := []struct {
		name string
		err  error
		log  string // "" for no log file
		want bool
	}{
		{"redis-server lost the bind", exited, "# Warning: Could not create server TCP listening socket 127.0.0.1:6379: bind: Address already in use\n", true},
		{"dedupgw lost the listen", exited, `{"msg":"listen tcp 127.0.0.1:41000: bind: address already in use"}` + "\n", true},
		{"exited for another reason", exited, "FATAL: bad config\n", false},
		{"did not exit", errors.New("did not answer PING within 10s"), "Address already in use\n", false},
		{"no log", exited, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "x.log")
			if tt.log != "" {
				if err := os.WriteFile(path, []byte(tt.log), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if got := lostPortRace(tt.err, path); got != tt.want {
				t.Errorf("got %v, want %v", got, tt.want)
			}
			_, err := os.Stat(path)
			if removed := errors.Is(err, os.ErrNotExist); tt.log != "" && removed != tt.want {
				t.Errorf("log removed: got %v, want %v (only a lost race's log goes)", removed, tt.want)
			}
		})
	}
}
