package main

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"time"
)

// newBareProxy returns the baseline: a bare httputil.ReverseProxy to target
// whose only tuning is its transport, the one a careful operator would write
// without dedupgw. maxIdle bounds the idle keep-alive connections kept to the
// upstream; it must be at least the load's concurrency (the default of 2 per
// host is a trap: every other request would dial).
func newBareProxy(target string, maxIdle int) (*httputil.ReverseProxy, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("parse upstream %q: %w", target, err)
	}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			pr.SetXForwarded()
		},
		Transport: newTransport(maxIdle),
	}, nil
}

// newTransport returns an HTTP/1.1 keep-alive transport that keeps up to
// maxIdle idle connections per host. The load driver and the bare proxy use it.
func newTransport(maxIdle int) *http.Transport {
	return &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          0, // no limit across hosts; the driver talks to several targets
		MaxIdleConnsPerHost:   maxIdle,
		IdleConnTimeout:       90 * time.Second,
		DisableCompression:    true,
		ForceAttemptHTTP2:     false,
		ResponseHeaderTimeout: 30 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
}
