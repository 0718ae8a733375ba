package dedup

import (
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Page sizes of Store.List.
const (
	// DefaultListLimit is the page size of a ListOptions whose Limit is zero
	// or negative.
	DefaultListLimit = 100
	// MaxListLimit is the largest page: a larger Limit is lowered to it.
	MaxListLimit = 1000
)

// ErrBadCursor is returned (wrapped) by List when ListOptions.Cursor is not
// a cursor that store handed out.
var ErrBadCursor = errors.New("dedup: invalid list cursor")

// ListOptions parameterise a List: which records, and which page.
type ListOptions struct {
	// States, when non-empty, lists only records in one of these states.
	// Empty means every state.
	States []State
	// Since and Until bound a record's time (Record.At): CompletedAt for a
	// processed or failed record, FirstSeen for a processing one. Since is
	// inclusive, Until exclusive. A zero Since or Until leaves that side open.
	Since, Until time.Time
	// Limit is the most entries one page holds. Zero or negative means
	// DefaultListLimit; more than MaxListLimit means MaxListLimit.
	Limit int
	// Cursor is the Next of the previous page, with the same namespace and
	// filters. Empty starts the listing.
	Cursor string
}

// PageLimit returns the page size o asks for, after defaults and the cap.
func (o ListOptions) PageLimit() int {
	switch {
	case o.Limit <= 0:
		return DefaultListLimit
	case o.Limit > MaxListLimit:
		return MaxListLimit
	}
	return o.Limit
}

// Match reports whether r passes o's state and time filters.
func (o ListOptions) Match(r Record) bool {
	if len(o.States) > 0 && !slices.Contains(o.States, r.State) {
		return false
	}
	at := r.At()
	if !o.Since.IsZero() && at.Before(o.Since) {
		return false
	}
	if !o.Until.IsZero() && !at.Before(o.Until) {
		return false
	}
	return true
}

// At is the instant a listing's time range compares: when the key was
// settled (CompletedAt) if it is processed or failed, so "processed between
// 10:00 and 11:00" finds what the application handled then, however long
// before the event first arrived; FirstSeen while it is processing, which
// has no CompletedAt.
func (r Record) At() time.Time {
	if r.State == StateProcessing || r.CompletedAt.IsZero() {
		return r.FirstSeen
	}
	return r.CompletedAt
}

// ListEntry is one listed key: its ID within the namespace and its record.
type ListEntry struct {
	ID string
	// Record is the key's record as Get returns it, except that Owner and
	// Response are never set.
	Record Record
}

// ListPage is one page of a List.
type ListPage struct {
	// Entries are the page's keys: at most the options' PageLimit, maybe
	// none even when Next is not empty (a store bounds the work of one page).
	Entries []ListEntry
	// Next is the cursor of the next page; empty when the listing is done.
	Next string
}

// keyCursorTag starts the cursors of KeyCursor.
const keyCursorTag = "k"

// KeyCursor returns the cursor of a store that lists in key order and
// resumes after id, the last ID it examined: an opaque, URL-safe string.
func KeyCursor(id string) string {
	return keyCursorTag + base64.RawURLEncoding.EncodeToString([]byte(id))
}

// ParseKeyCursor returns the ID a KeyCursor resumes after; "" for an empty
// cursor (the start). Anything else fails with an error wrapping
// ErrBadCursor.
func ParseKeyCursor(cursor string) (string, error) {
	if cursor == "" {
		return "", nil
	}
	rest, ok := strings.CutPrefix(cursor, keyCursorTag)
	if !ok {
		return "", fmt.Errorf("%w: not a cursor this store hands out", ErrBadCursor)
	}
	id, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil {
		return "", fmt.Errorf("%w: not a cursor this store hands out", ErrBadCursor)
	}
	return string(id), nil
}
