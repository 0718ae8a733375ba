// Package chaos is dedupgw's fault-injection suite. It runs the real dedupgw
// binary between a simulated webhook provider and a deliberately flaky
// upstream application, injects faults while traffic flows (kill -9 of a
// replica, Redis stopped and restarted, SIGTERM during traffic, Redis slowed
// through a TCP delay proxy) and checks the product's promise at the end: no
// event is lost, and every duplicate that reached the application is explained
// by one of the documented limits (a crash between the upstream's 2xx and the
// commit, or fail-open while the store was unreachable).
//
// The parts are usable on their own:
//
//   - Simulator delivers events like Stripe does: at a steady rate, retrying
//     every delivery without a 2xx with exponential backoff, resending some
//     events after success and some as concurrent bursts.
//   - App is the upstream application: it counts every event it answered 2xx
//     to and fails on purpose (5xx, answers slower than the gateway's upstream
//     timeout, connection resets).
//   - DelayProxy is an in-process TCP proxy that adds latency, or drops
//     replies, on demand.
//   - Redis runs a real redis-server on a fixed 127.0.0.1 port that survives
//     Stop and Start.
//   - Gateway runs one dedupgw replica from a config file and can kill,
//     terminate and restart it.
//
// The tests run a short mode by default (a few hundred events, well under a
// minute) and a full mode when DEDUPGW_CHAOS=full is set.
package chaos
