package storetest

import (
	"sync"
	"time"
)

// Epoch is the instant a FakeClock made by the suite starts at. It is a whole
// second, so stores that keep millisecond or second precision compare equal.
var Epoch = time.Date(2026, time.January, 2, 3, 4, 5, 0, time.UTC)

// FakeClock is a manually advanced clock, safe for concurrent use. Its Now
// method is a dedup.Clock. Backend tests may use it for their own tests.
type FakeClock struct {
	mu  sync.Mutex
	now time.Time
}

// NewFakeClock returns a clock that reads start until advanced.
func NewFakeClock(start time.Time) *FakeClock {
	return &FakeClock{now: start}
}

// Now returns the clock's current time.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d and returns the new time.
func (c *FakeClock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}
