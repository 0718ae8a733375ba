package proxy

import (
	"context"
	"sync"
	"time"
)

// opContext is the context of one store operation (claim, get, commit,
// release): it carries the values of values, which is never cancelled (a
// context.WithoutCancel of the delivery's request context), and its deadline
// is fixed when it is made. It behaves as
// context.WithDeadline(values, deadline) does, and stop as that context's
// cancel func, with one difference in cost: the runtime timer behind Done is
// only armed when Done is first called. Most store operations finish without
// anyone waiting on Done (memstore only checks Err), and arming and stopping
// a timer for each operation cost the gateway about a microsecond of CPU per
// store operation.
//
// Until Done is called, Err reports the deadline by reading the clock. The
// first call to Done makes the standard context (inner), which from then on
// answers Done, Err and Value: a context derived from this one
// (context.WithCancel, context.AfterFunc) therefore finds inner's
// cancellation through Value and is attached to it as to any standard
// context, without a goroutine of its own.
type opContext struct {
	values   context.Context
	deadline time.Time

	mu    sync.Mutex
	err   error           // before inner: DeadlineExceeded or Canceled once seen
	inner context.Context // made by the first Done
	stopI context.CancelFunc
}

var _ context.Context = (*opContext)(nil)

// newOpContext returns an operation context with the values of values (which
// must never be cancelled) and the deadline now+timeout. The caller must call
// stop once the operation returned.
func newOpContext(values context.Context, now time.Time, timeout time.Duration) *opContext {
	return &opContext{values: values, deadline: now.Add(timeout)}
}

// Deadline implements context.Context.
func (c *opContext) Deadline() (time.Time, bool) { return c.deadline, true }

// Done implements context.Context. The first call arms the deadline's timer.
func (c *opContext) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.materialize().Done()
}

// materialize makes inner, in the state c is in: a deadline already past
// makes a context that is done with DeadlineExceeded, a stop before makes one
// cancelled. c.mu must be held.
func (c *opContext) materialize() context.Context {
	if c.inner == nil {
		c.inner, c.stopI = context.WithDeadline(c.values, c.deadline)
		if c.err == context.Canceled {
			c.stopI()
		}
	}
	return c.inner
}

// Err implements context.Context.
func (c *opContext) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inner != nil {
		return c.inner.Err()
	}
	if c.err == nil && time.Until(c.deadline) <= 0 { // monotonic: one clock read
		c.err = context.DeadlineExceeded
	}
	return c.err
}

// Value implements context.Context.
func (c *opContext) Value(key any) any {
	c.mu.Lock()
	inner := c.inner
	c.mu.Unlock()
	if inner != nil {
		return inner.Value(key)
	}
	return c.values.Value(key)
}

// stop cancels c, as the cancel func of context.WithDeadline does: Err stays
// DeadlineExceeded when the deadline was reached first, and becomes Canceled
// otherwise. It releases the timer, if one was armed.
func (c *opContext) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inner != nil {
		c.stopI()
		return
	}
	if c.err == nil {
		c.err = context.Canceled
	}
}

// String describes c for debugging, as the standard contexts do.
func (c *opContext) String() string {
	return "proxy.opContext(deadline " + c.deadline.String() + ")"
}
