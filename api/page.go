package api

// page.go makes and reads page tokens: opaque to clients, base64 (URL-safe, unpadded) of
// a version, the offset of the next page and a hash of the request's filter, so a token
// used with a changed filter is refused (INVALID_ARGUMENT, field page_token) rather than
// paging through another result.

import (
	"encoding/base64"
	"encoding/binary"
	"hash/fnv"
	"strings"
	"time"
)

const pageTokenVersion = 1

// filterKey is the hash of a list call's filter fields (and which list it is).
func filterKey(fields ...string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(strings.Join(fields, "\x00")))
	return h.Sum64()
}

// encodePageToken returns the token of the page at offset for filter.
func encodePageToken(offset int, filter uint64) string {
	var b [1 + binary.MaxVarintLen64 + 8]byte
	b[0] = pageTokenVersion
	n := 1 + binary.PutUvarint(b[1:], uint64(offset))
	binary.BigEndian.PutUint64(b[n:], filter)
	return base64.RawURLEncoding.EncodeToString(b[:n+8])
}

// decodePageToken returns the offset of token ("" is the first page, 0).
func decodePageToken(token string, filter uint64) (int, error) {
	if token == "" {
		return 0, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || len(b) < 1+1+8 || b[0] != pageTokenVersion {
		return 0, fieldErr("page_token", "not a page token of this call")
	}
	off, n := binary.Uvarint(b[1:])
	if n <= 0 || 1+n+8 != len(b) || off > 1<<31 {
		return 0, fieldErr("page_token", "not a page token of this call")
	}
	if binary.BigEndian.Uint64(b[1+n:]) != filter {
		return 0, fieldErr("page_token", "the token is of a request with other filters: keep every field but page_token and page_size the same, or start again without a token")
	}
	return int(off), nil
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}
