package boltstore

import (
	"context"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/dedup/storetest"
)

// On a volume without room for a journal file (segmentBytes), Open succeeds
// but the store cannot record from the start: it says so, Ping fails and a
// new key is not claimed, so no event is forwarded whose commit would be
// lost. Once the volume has room, a claim's probe finds out and claims
// resume. (Found by an operator trial on a 2 MB volume: the first event was
// forwarded, its commit failed, and its next copy was forwarded again.) The
// volume is a real tmpfs, which needs root.
func TestOpenWithoutRoomForTheJournal(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=2m"); err != nil {
		t.Skipf("needs a tmpfs mount (root): %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, 0) }) // after Close, before TempDir's removal
	clk := storetest.NewFakeClock(storetest.Epoch)
	core, logs := observer.New(zapcore.ErrorLevel)
	s, err := Open(filepath.Join(dir, "dedup.db"), Options{Now: clk.Now, Logger: zap.New(core), SweepInterval: -1, CheckpointInterval: -1})
	if err != nil {
		t.Fatalf("Open: got %v, want nil (a store that cannot record yet)", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()

	const full = "no space left on device"
	if got := logs.FilterMessageSnippet("the journal cannot record").All(); len(got) != 1 || !strings.Contains(got[0].ContextMap()["error"].(string), full) {
		t.Errorf("error logs at Open: got %v, want one saying the journal cannot record, with %q", logs.All(), full)
	}
	if err := s.Ping(ctx); err == nil || !strings.Contains(err.Error(), full) {
		t.Errorf("Ping: got %v, want %q", err, full)
	}
	clk.Advance(probeEvery)
	if _, err := s.Claim(ctx, key("evt_1"), dedup.ClaimOptions{Lease: time.Minute}); err == nil || !strings.Contains(err.Error(), "commits cannot be recorded") {
		t.Errorf("Claim: got %v, want a commits-cannot-be-recorded error", err)
	}

	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_REMOUNT, "size=16m"); err != nil {
		t.Fatalf("grow the volume: %v", err)
	}
	clk.Advance(probeEvery)
	claimCommit(t, s, key("evt_1"), time.Hour)
	if res, err := s.Claim(ctx, key("evt_1"), dedup.ClaimOptions{Lease: time.Minute}); err != nil || res.Outcome != dedup.Duplicate {
		t.Errorf("Claim of the committed key: got (%v, %v), want (Duplicate, nil)", res.Outcome, err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Errorf("Ping once the volume has room: got %v, want nil", err)
	}
}
