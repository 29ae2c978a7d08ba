package jsonscan

// maxNames bounds Names: past it the names are forgotten (a decoder fed ever new
// names must not grow without bound).
const maxNames = 16384

// Names interns the strings a decoder reads again and again (schema, table and column
// names), so that a name read from the input costs no allocation after its first time.
// The zero value is ready to use; Names is not safe for concurrent use (each decoder
// state holds its own).
type Names struct {
	m map[string]string
}

// Intern returns b as a string, the same string for equal bytes.
func (n *Names) Intern(b []byte) string {
	if s, ok := n.m[string(b)]; ok {
		return s
	}
	if n.m == nil {
		n.m = map[string]string{}
	}
	s := string(b)
	n.m[s] = s
	return s
}

// Trim forgets every name once there are more than 16384 of them.
func (n *Names) Trim() {
	if len(n.m) > maxNames {
		clear(n.m)
	}
}
