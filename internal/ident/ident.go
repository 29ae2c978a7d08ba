// Package ident is the one SQL identifier escaper of parity. The applier (cdc), the diff
// engine (checker), the workload generator (cdc/loadgen) and the benchmark tools all
// write schema, table and column names into SQL; they share this leaf package (no
// imports beyond the standard library) so that the rule is written once and neither cdc
// nor checker has to import the other.
package ident

import "strings"

// Quote back-quotes name for MySQL, TiDB and MariaDB, doubling embedded back-quotes.
func Quote(name string) string {
	return "`" + strings.ReplaceAll(name, "`", "``") + "`"
}

// Table returns `schema`.`table`.
func Table(schema, table string) string {
	return Quote(schema) + "." + Quote(table)
}
