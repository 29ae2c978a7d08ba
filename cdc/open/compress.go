package open

import (
	"bytes"
	"fmt"
	"io"

	"github.com/klauspost/compress/snappy"
	"github.com/pierrec/lz4/v4"
)

// Compression is TiCDC's large-message-handle-compression: every row and DDL payload is
// compressed on its own, with no marker on the wire, so producer and consumer must agree.
type Compression string

const (
	CompressionNone   Compression = "none"
	CompressionSnappy Compression = "snappy" // snappy block format (klauspost/compress/snappy)
	CompressionLZ4    Compression = "lz4"    // LZ4 frame format (pierrec/lz4/v4)
)

// Validate reports whether c is a known compression ("" means none).
func (c Compression) Validate() error {
	switch c {
	case "", CompressionNone, CompressionSnappy, CompressionLZ4:
		return nil
	}
	return fmt.Errorf("unknown compression %q (want none, snappy or lz4)", string(c))
}

func (c Compression) none() bool { return c == "" || c == CompressionNone }

// compress compresses one payload the way tiflow's pkg/compression.Encode does.
func compress(c Compression, data []byte) ([]byte, error) {
	switch c {
	case "", CompressionNone:
		return data, nil
	case CompressionSnappy:
		return snappy.Encode(nil, data), nil
	case CompressionLZ4:
		var buf bytes.Buffer
		w := lz4.NewWriter(&buf)
		if _, err := w.Write(data); err != nil {
			return nil, fmt.Errorf("lz4 compress: %w", err)
		}
		if err := w.Close(); err != nil {
			return nil, fmt.Errorf("lz4 compress: %w", err)
		}
		return buf.Bytes(), nil
	}
	return nil, c.Validate()
}

// decompress reverses compress into st's scratch (valid until the next payload),
// refusing to produce more than limit bytes.
func (st *decodeState) decompress(c Compression, data []byte, limit int) ([]byte, error) {
	switch c {
	case "", CompressionNone:
		return data, nil
	case CompressionSnappy:
		n, err := snappy.DecodedLen(data)
		if err != nil {
			return nil, fmt.Errorf("%w: snappy: %v", ErrCompression, err)
		}
		if n > limit {
			return nil, fmt.Errorf("%w: snappy header claims %d bytes, limit %d", ErrTooLarge, n, limit)
		}
		// A snappy element of k bytes expands to at most 64 (a 3-byte copy), so a
		// larger claim is corrupt: refuse before allocating it.
		if n > 22*len(data)+64 {
			return nil, fmt.Errorf("%w: snappy header claims %d bytes from %d compressed bytes", ErrCompression, n, len(data))
		}
		st.dbuf.Reset()
		st.dbuf.Grow(n)
		out, err := snappy.Decode(st.dbuf.AvailableBuffer()[:n], data)
		if err != nil {
			return nil, fmt.Errorf("%w: snappy: %v", ErrCompression, err)
		}
		return out, nil
	case CompressionLZ4:
		if st.lz4 == nil {
			st.lz4 = lz4.NewReader(nil)
		}
		st.lzsrc.Reset(data)
		st.lz4.Reset(&st.lzsrc)
		st.lzlim = io.LimitedReader{R: st.lz4, N: int64(limit) + 1}
		st.dbuf.Reset()
		st.dbuf.Grow(min(4*len(data), limit) + 1)
		n, err := st.dbuf.ReadFrom(&st.lzlim)
		if err != nil {
			return nil, fmt.Errorf("%w: lz4: %v", ErrCompression, err)
		}
		if n > int64(limit) {
			return nil, fmt.Errorf("%w: lz4 payload exceeds %d bytes", ErrTooLarge, limit)
		}
		return st.dbuf.Bytes(), nil
	}
	return nil, c.Validate()
}
