// The protobuf code generators, pinned: `make generate` builds them from here so the
// product's go.mod carries none of them.
module github.com/tidb-parity/parity/scripts/protoc

go 1.26

tool (
	google.golang.org/grpc/cmd/protoc-gen-go-grpc
	google.golang.org/protobuf/cmd/protoc-gen-go
)

require (
	google.golang.org/grpc/cmd/protoc-gen-go-grpc v1.6.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)
