// Package fleet is one answer over many fallback servers: the estate a sharded MySQL
// migration rolls back to, each fallback fed by its own changefeed and kept by its own
// `parity serve` (with its own meta schema, lease and standby). The fleet is not a
// cluster manager: TiDB's TSO is its clock and the members' gRPC APIs are its interface.
//
// It owns the fleet file (members, their addresses and the tables each owns; a table
// owned by no member or by two is refused, naming it), the fleet point (every member
// opens its run's first snapshot pair at exactly one TSO T, retried at a newer T when a
// member has applied past it), the fleet's status (the worst member's lag), fleet
// verification and the fleet cutover check (passed only when every member passed at T
// and every selected table is owned by a member that passed; a member not heard from
// is a failure naming it, never a pass).
//
// It is a client of the API (api, api/parity/v1): what it knows of a member is what
// the member's API says. It imports checker only for its table patterns (one syntax for
// every schema.table pattern), never cdc.
package fleet
