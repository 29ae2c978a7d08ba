package ledger

import (
	"errors"
	"reflect"
	"testing"

	"github.com/tidb-parity/parity/internal/rowkey"
)

func key(t testing.TB, vals ...any) rowkey.Key {
	k, err := rowkey.Encode(vals...)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestCompactEncodeDecode(t *testing.T) {
	in := []Entry{
		{key(t, int64(3)), 105}, {key(t, int64(1)), 101}, {key(t, int64(3)), 109},
		{key(t, int64(2), "a"), 100}, {key(t, int64(1)), 100},
	}
	got := Compact(in)
	want := []Entry{{key(t, int64(1)), 101}, {key(t, int64(2), "a"), 100}, {key(t, int64(3)), 109}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Compact = %v, want %v", got, want)
	}
	blob, err := Encode(got, 100)
	if err != nil {
		t.Fatal(err)
	}
	back, err := Decode(blob, 100)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, want) {
		t.Fatalf("Decode = %v, want %v", back, want)
	}
	if _, err := Encode(want, 101); err == nil {
		t.Fatal("an entry below min ts encoded")
	}
	// Integer keys of a round compress well: 50,000 sequential ids.
	var many []Entry
	for i := range 50000 {
		many = append(many, Entry{key(t, int64(i)), 470000000000000000 + uint64(i%16)})
	}
	blob, _ = Encode(Compact(many), 470000000000000000)
	if len(blob) > 20000 {
		t.Fatalf("50,000 integer keys take %d bytes", len(blob))
	}
	t.Logf("50,000 integer keys: %d bytes", len(blob))
	for _, bad := range [][]byte{nil, {2}, {format, 0xff, 0xff}, append([]byte{format}, []byte("junk")...)} {
		if _, err := Decode(bad, 0); !errors.Is(err, ErrCorrupt) {
			t.Errorf("Decode(%x) = %v, want ErrCorrupt", bad, err)
		}
	}
}

// FuzzDecode: Decode never panics and whatever it accepts encodes back to an equal list.
func FuzzDecode(f *testing.F) {
	blob, _ := Encode([]Entry{{rowkey.Key{2, 0, 0, 0, 0, 0, 0, 0, 1}, 5}}, 3)
	f.Add(blob, uint64(3))
	f.Add([]byte{format}, uint64(0))
	f.Fuzz(func(t *testing.T, b []byte, minTs uint64) {
		es, err := Decode(b, minTs)
		if err != nil {
			return
		}
		again, err := Encode(es, minTs)
		if err != nil {
			t.Fatal(err)
		}
		es2, err := Decode(again, minTs)
		if err != nil || !reflect.DeepEqual(es, es2) && len(es) > 0 {
			t.Fatalf("re-encoded entries differ: %v vs %v (%v)", es, es2, err)
		}
	})
}
