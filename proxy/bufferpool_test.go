package proxy

import (
	"sync"
	"testing"
)

// TestBufferPoolKeepsOnlyCopyBuffers: Get always returns a whole
// copyBufferSize buffer, whatever was Put (a short buffer, a longer one, a
// window into another's array, a buffer sliced short).
func TestBufferPoolKeepsOnlyCopyBuffers(t *testing.T) {
	var p bufferPool
	big := make([]byte, 2*copyBufferSize)
	for range 100 { // sync.Pool may drop any Put: try often
		p.Put(make([]byte, 10))
		p.Put(make([]byte, copyBufferSize+1))
		p.Put(big[1:copyBufferSize])
		p.Put(make([]byte, copyBufferSize)[:5])
		for range 4 {
			if b := p.Get(); len(b) != copyBufferSize || cap(b) != copyBufferSize {
				t.Fatalf("Get: got len %d cap %d, want %d", len(b), cap(b), copyBufferSize)
			}
		}
	}
}

// TestBufferPoolNeverShares: buffers got at the same time are distinct,
// however Get and Put interleave (run with -race).
func TestBufferPoolNeverShares(t *testing.T) {
	var p bufferPool
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				a, b := p.Get(), p.Get()
				if &a[0] == &b[0] {
					t.Errorf("two Gets returned one buffer")
					return
				}
				mark := byte(g*31 + i)
				a[0], a[copyBufferSize-1], b[0] = mark, mark, ^mark
				if a[0] != mark || a[copyBufferSize-1] != mark {
					t.Errorf("a buffer held by one caller was written by another")
					return
				}
				p.Put(a)
				p.Put(b)
			}
		})
	}
	wg.Wait()
}

// TestAnswerBodyClosedTwicePutsOnce: a second Close of an answer read
// whole does not give its buffer to the pool again (two later Gets would
// share it).
func TestAnswerBodyClosedTwicePutsOnce(t *testing.T) {
	var p bufferPool
	d := &delivery{upPool: &p}
	d.upBuf = p.Get()
	d.upBody.Reset(d.upBuf[:3])
	a := (*answerBody)(d)
	_ = a.Close()
	_ = a.Close()
	if n, err := a.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Errorf("Read after Close: got %d, %v; want 0 and an error", n, err)
	}
	x, y := p.Get(), p.Get()
	if &x[0] == &y[0] {
		t.Errorf("after two Closes: two Gets returned one buffer")
	}
}
