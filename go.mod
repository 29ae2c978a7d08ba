module github.com/tidb-parity/parity

go 1.26.0

require (
	github.com/go-sql-driver/mysql v1.10.1
	github.com/segmentio/kafka-go v0.4.51
	github.com/spf13/cobra v1.10.2
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/klauspost/compress v1.20.1 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	github.com/spf13/pflag v1.0.9 // indirect
	golang.org/x/net v0.59.0 // indirect
)
